/* The data layer's hot loops in C: TFRecord framing of a whole buffer; decoding of video-level Examples straight into
 * a batch's float32 rows, of frame-level SequenceExamples straight into a batch's uint8 [frames, bytes] rows (no Python
 * per frame: bench/README.md, 0.23x the read-and-CRC floor's speed before, 1.0x after), and of 2019 segment ratings
 * from a SequenceExample's context (frames not read).
 *
 * Hand-written because no maintained library does either into preallocated arrays, and bench/bench_read.py shows
 * the Python loops were the limit: about 5.6 us per record (178k examples/s) against tf.data's best passes of
 * 176k. The CRC itself stays with the crc32c package (called per record). Whatever these loops do not take (any
 * damaged or unusual record) goes back to the Python code, which has the rules in full and writes the errors.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { FRAME_LIMIT = 0, FRAME_NEED_BYTES = 1, FRAME_BAD_LENGTH_CRC = 2, FRAME_BAD_PAYLOAD_CRC = 3 };
enum { HEADER_SIZE = 12, FOOTER_SIZE = 4 };
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };
enum { KIND_NONE = 0, KIND_BYTES = 1, KIND_FLOAT = 2, KIND_INT64 = 3 };
#define MASK_DELTA 0xA282EAD8u
#define MAX_KEYS 64

static PyObject *crc32c_function; /* crc32c.crc32c */

static uint64_t load_u64(const uint8_t *p) {
    uint64_t value = 0;
    for (int i = 7; i >= 0; i--) value = (value << 8) | p[i];
    return value;
}

static uint32_t load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* TensorFlow's masked CRC-32C of data[0:size], by the crc32c package; -1 with an exception set on failure. */
static int masked_crc(const uint8_t *data, Py_ssize_t size, uint32_t *masked) {
    PyObject *view = PyMemoryView_FromMemory((char *)data, size, PyBUF_READ);
    if (view == NULL) return -1;
    PyObject *result = PyObject_CallOneArg(crc32c_function, view);
    Py_DECREF(view);
    if (result == NULL) return -1;
    unsigned long crc = PyLong_AsUnsignedLong(result);
    Py_DECREF(result);
    if (crc == (unsigned long)-1 && PyErr_Occurred()) return -1;
    uint32_t c = (uint32_t)crc;
    *masked = ((c >> 15) | (c << 17)) + MASK_DELTA;
    return 0;
}

PyDoc_STRVAR(frame_records_doc,
"frame_records(buffer, pos, fill, limit, starts, ends) -> (count, pos, status, needed)\n\n"
"Verify and locate the records of buffer[pos:fill] until `limit` records are taken or one is incomplete or\n"
"corrupt: payload i lies at buffer[starts[i]:ends[i]] (int64 arrays). Returns how many were taken, the position\n"
"after them, the status (FRAME_LIMIT, FRAME_NEED_BYTES, or FRAME_BAD_LENGTH_CRC / FRAME_BAD_PAYLOAD_CRC for the\n"
"record at that position) and, when bytes are needed, how many the record at that position takes in all.");

static PyObject *frame_records(PyObject *self, PyObject *args) {
    Py_buffer buffer, starts, ends;
    Py_ssize_t pos, fill, limit, count = 0;
    if (!PyArg_ParseTuple(args, "y*nnnw*w*", &buffer, &pos, &fill, &limit, &starts, &ends)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t capacity = (starts.len < ends.len ? starts.len : ends.len) / (Py_ssize_t)sizeof(int64_t);
    if (pos < 0 || fill > buffer.len || pos > fill || limit < 0 || limit > capacity) {
        PyErr_SetString(PyExc_ValueError, "frame_records: positions or counts out of range");
        goto done;
    }
    const uint8_t *data = buffer.buf;
    int64_t *start_out = starts.buf, *end_out = ends.buf;
    int status = FRAME_LIMIT;
    unsigned long long needed = 0;
    /* A file's records share a few lengths: each length's CRC is checked once per call. */
    uint64_t known_lengths[4];
    uint32_t known_crcs[4];
    int known = 0;
    while (count < limit) {
        if (fill - pos < HEADER_SIZE) {
            status = FRAME_NEED_BYTES;
            needed = HEADER_SIZE;
            break;
        }
        uint64_t length = load_u64(data + pos);
        uint32_t length_crc = load_u32(data + pos + 8);
        int seen = 0;
        for (int i = 0; i < known && i < 4; i++) seen |= known_lengths[i] == length && known_crcs[i] == length_crc;
        if (!seen) {
            uint32_t crc;
            if (masked_crc(data + pos, 8, &crc) < 0) goto done;
            if (crc != length_crc) {
                status = FRAME_BAD_LENGTH_CRC;
                break;
            }
            known_lengths[known % 4] = length;
            known_crcs[known % 4] = length_crc;
            known++;
        }
        if (length > (uint64_t)(fill - pos - HEADER_SIZE - FOOTER_SIZE) || fill - pos < HEADER_SIZE + FOOTER_SIZE) {
            status = FRAME_NEED_BYTES;
            /* saturated: a damaged length near 2^64 must not wrap around to a few bytes */
            needed = length > ULLONG_MAX - HEADER_SIZE - FOOTER_SIZE ? ULLONG_MAX
                                                                      : (unsigned long long)length + HEADER_SIZE + FOOTER_SIZE;
            break;
        }
        Py_ssize_t payload = pos + HEADER_SIZE, end = payload + (Py_ssize_t)length;
        uint32_t crc;
        if (masked_crc(data + payload, (Py_ssize_t)length, &crc) < 0) goto done;
        if (crc != load_u32(data + end)) {
            status = FRAME_BAD_PAYLOAD_CRC;
            break;
        }
        start_out[count] = payload;
        end_out[count] = end;
        count++;
        pos = end + FOOTER_SIZE;
    }
    result = Py_BuildValue("nniK", count, pos, status, needed);
done:
    PyBuffer_Release(&buffer);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return result;
}

/* ---- Example decoding ---- */

typedef struct {
    const uint8_t *p, *end;
} Cursor;

static int read_varint(Cursor *c, uint64_t *value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && c->p < c->end; shift += 7) {
        uint8_t byte = *c->p++;
        v |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *value = v;
            return 1;
        }
    }
    return 0;
}

/* The next field: its number, wire type, and its value (varints) or content (length-delimited and fixed). */
static int next_field(Cursor *c, uint64_t *number, int *wire, uint64_t *value, Cursor *content) {
    uint64_t tag;
    if (!read_varint(c, &tag)) return 0;
    *number = tag >> 3;
    *wire = (int)(tag & 7);
    Py_ssize_t width;
    switch (*wire) {
    case WIRE_VARINT:
        return read_varint(c, value);
    case WIRE_FIXED64:
        width = 8;
        break;
    case WIRE_FIXED32:
        width = 4;
        break;
    case WIRE_LEN:
        if (!read_varint(c, value) || *value > (uint64_t)(c->end - c->p)) return 0;
        width = (Py_ssize_t)*value;
        break;
    default: /* groups and invalid wire types: left to the Python decoder, which reports or skips them */
        return 0;
    }
    if (c->end - c->p < width) return 0;
    content->p = c->p;
    content->end = c->p + width;
    c->p += width;
    return 1;
}

/* Rows of up to MAX_COLUMNS int64 values, grown together: labels as (row, label id), ratings as (row, start, class,
 * rating). `failed` says an allocation failed (out of memory). */
#define MAX_COLUMNS 4
typedef struct {
    int64_t *columns[MAX_COLUMNS];
    int width;
    Py_ssize_t count, capacity;
    int failed;
} Table;

static int push_row(Table *table, const int64_t *values) {
    if (table->count == table->capacity) {
        Py_ssize_t capacity = table->capacity ? 2 * table->capacity : 4096;
        for (int i = 0; i < table->width; i++) {
            int64_t *grown = realloc(table->columns[i], capacity * sizeof(int64_t));
            if (grown == NULL) {
                table->failed = 1;
                return 0;
            }
            table->columns[i] = grown;
        }
        table->capacity = capacity;
    }
    for (int i = 0; i < table->width; i++) table->columns[i][table->count] = values[i];
    table->count++;
    return 1;
}

static int push_label(Table *labels, int64_t row, int64_t value) {
    int64_t values[2] = {row, value};
    return push_row(labels, values);
}

static void free_table(Table *table) {
    for (int i = 0; i < table->width; i++) free(table->columns[i]);
}

/* The table's columns as a tuple of bytes objects of int64 (empty ones where it has no rows). */
static PyObject *table_columns(const Table *table) {
    PyObject *columns = PyTuple_New(table->width);
    for (int i = 0; columns != NULL && i < table->width; i++) {
        /* a NULL pointer would make None: no rows must still be empty bytes */
        PyObject *column = PyBytes_FromStringAndSize(table->count ? (const char *)table->columns[i] : "",
                                                     table->count * 8);
        if (column == NULL) {
            Py_CLEAR(columns);
            break;
        }
        PyTuple_SET_ITEM(columns, i, column);
    }
    return columns;
}

/* The next value field (number 1) of a BytesList, FloatList or Int64List: 1, or 0 at the list's end, or -1 where
 * it is malformed. */
static int next_value(Cursor *list, int *wire, uint64_t *value, Cursor *content) {
    uint64_t number;
    while (list->p < list->end) {
        if (!next_field(list, &number, wire, value, content)) return -1;
        if (number == 1) return 1;
    }
    return 0;
}

/* Copy `count` little-endian floats to `out`; false if one is NaN or infinite. The check rides along the copy,
 * vectorized with it: a value is finite when its magnitude bits are below the all-ones exponent (0x7F800000), that
 * is when magnitude - 0x7F800000 has its top bit set; the AND of those differences keeps that bit only if every
 * value is finite. */
static int copy_finite(float *out, const uint8_t *in, Py_ssize_t count) {
    uint32_t finite_bits = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t bits;
#if PY_BIG_ENDIAN
        bits = load_u32(in + 4 * i);
#else
        memcpy(&bits, in + 4 * i, 4);
#endif
        memcpy(out + i, &bits, 4);
        finite_bits &= (bits & 0x7FFFFFFFu) - 0x7F800000u;
    }
    return (int)(finite_bits >> 31);
}

/* Copy a FloatList's values (packed or not) into out[0:size]; false unless there are exactly `size`, all finite. */
static int copy_floats(Cursor list, float *out, int64_t size) {
    int64_t count = 0;
    uint64_t value;
    int wire, found;
    Cursor content = {NULL, NULL}; /* set for the wire types read below; initialized for compilers that cannot tell */
    while ((found = next_value(&list, &wire, &value, &content)) > 0) {
        if (wire != WIRE_LEN && wire != WIRE_FIXED32) return 0;
        Py_ssize_t bytes = content.end - content.p;
        if (bytes % 4 || count + bytes / 4 > size || !copy_finite(out + count, content.p, bytes / 4)) return 0;
        count += bytes / 4;
    }
    return found == 0 && count == size;
}

/* Append an Int64List's values (packed or not) as labels of `row`; false for a value outside [0, num_classes). */
static int read_labels(Cursor list, int64_t row, int64_t num_classes, Table *labels) {
    uint64_t value;
    int wire, found;
    Cursor content;
    while ((found = next_value(&list, &wire, &value, &content)) > 0) {
        if (wire == WIRE_VARINT) {
            if (value >= (uint64_t)num_classes || !push_label(labels, row, (int64_t)value)) return 0;
            continue;
        }
        if (wire != WIRE_LEN) return 0;
        while (content.p < content.end) {
            if (!read_varint(&content, &value) || value >= (uint64_t)num_classes) return 0;
            if (!push_label(labels, row, (int64_t)value)) return 0;
        }
    }
    return found == 0;
}

/* The one value of a BytesList: false for none or several. */
static int single_bytes(Cursor list, Cursor *value_out) {
    uint64_t value;
    int wire, found, values = 0;
    Cursor content;
    while ((found = next_value(&list, &wire, &value, &content)) > 0) {
        if (wire != WIRE_LEN || values++) return 0;
        *value_out = content;
    }
    return found == 0 && values == 1;
}

typedef struct {
    Py_ssize_t num_features; /* keys: the features, then "labels", "id", "video_id" */
    Py_ssize_t num_keys;
    const char *keys[MAX_KEYS];
    Py_ssize_t key_sizes[MAX_KEYS];
    int64_t float_sizes[MAX_KEYS];
    int64_t float_offsets[MAX_KEYS];
    int64_t num_classes;
} Wanted;

/* A map entry's key and its Feature's one kind and list; false for repeated or missing parts. */
static int read_entry(Cursor entry, Cursor *key, int *kind, Cursor *list) {
    uint64_t number, value;
    int wire, seen_key = 0, seen_value = 0;
    Cursor content, feature = {NULL, NULL};
    key->p = key->end = entry.p;
    while (entry.p < entry.end) {
        if (!next_field(&entry, &number, &wire, &value, &content)) return 0;
        if (number == 1) {
            if (wire != WIRE_LEN || seen_key++) return 0;
            *key = content;
        } else if (number == 2) {
            if (wire != WIRE_LEN || seen_value++) return 0;
            feature = content;
        }
    }
    *kind = KIND_NONE;
    if (!seen_value) return 1;
    while (feature.p < feature.end) {
        if (!next_field(&feature, &number, &wire, &value, &content)) return 0;
        if (number < KIND_BYTES || number > KIND_INT64) continue;
        if (wire != WIRE_LEN || *kind != KIND_NONE) return 0;
        *kind = (int)number;
        *list = content;
    }
    return 1;
}

static Py_ssize_t find_key(const Wanted *wanted, Cursor key) {
    Py_ssize_t size = key.end - key.p;
    for (Py_ssize_t i = 0; i < wanted->num_keys; i++)
        if (wanted->key_sizes[i] == size && memcmp(wanted->keys[i], key.p, size) == 0) return i;
    return -1;
}

/* What a context's wanted features (keys before "labels") get: called with the feature's index, kind and list;
 * false where the record must go to Python. */
typedef int (*FeatureHandler)(void *state, Py_ssize_t index, int kind, Cursor list);

/* Walk an Example's features (a SequenceExample's context: the same field): each wanted feature to `handle`,
 * labels into `labels` as (row, id) (ignored where `labels` is NULL), the id's bounds into `id`; false (labels
 * rolled back by the caller) where the Python decoder must take the record: anything malformed, missing, repeated,
 * of another kind or size, or out of range. */
static int walk_features(Cursor record, const Wanted *wanted, int64_t row, Table *labels, Cursor *id,
                         FeatureHandler handle, void *state) {
    uint64_t number, value;
    int wire, kind;
    Cursor content, features = {NULL, NULL}, key, list, entry;
    int seen_features = 0, seen[MAX_KEYS] = {0};
    while (record.p < record.end) {
        if (!next_field(&record, &number, &wire, &value, &content)) return 0;
        if (number != 1) continue;
        if (wire != WIRE_LEN || seen_features++) return 0;
        features = content;
    }
    Cursor ids[2] = {{NULL, NULL}, {NULL, NULL}};
    Py_ssize_t labels_key = wanted->num_features;
    while (features.p < features.end) {
        if (!next_field(&features, &number, &wire, &value, &entry)) return 0;
        if (number != 1) continue;
        if (wire != WIRE_LEN || !read_entry(entry, &key, &kind, &list)) return 0;
        Py_ssize_t index = find_key(wanted, key);
        if (index < 0 || (index == labels_key && labels == NULL)) continue;
        if (seen[index]++) return 0; /* a repeated key: protobuf's last-wins is left to Python */
        if (index < labels_key) {
            if (!handle(state, index, kind, list)) return 0;
        } else if (index == labels_key) {
            if (kind == KIND_NONE) continue;
            if (kind != KIND_INT64 || !read_labels(list, row, wanted->num_classes, labels)) return 0;
        } else {
            if (kind != KIND_BYTES || !single_bytes(list, &ids[index - labels_key - 1])) return 0;
        }
    }
    if (!seen[labels_key + 1] && !seen[labels_key + 2]) return 0;
    *id = seen[labels_key + 1] ? ids[0] : ids[1];
    return 1;
}

typedef struct {
    const Wanted *wanted;
    float *out_row;
    int seen; /* features copied */
} FloatRow;

static int copy_feature(void *state, Py_ssize_t index, int kind, Cursor list) {
    FloatRow *row = state;
    const Wanted *wanted = row->wanted;
    row->seen++;
    return kind == KIND_FLOAT &&
           copy_floats(list, row->out_row + wanted->float_offsets[index], wanted->float_sizes[index]);
}

/* Decode one Example into `row`: its floats, id bounds and labels (see walk_features). */
static int decode_one(Cursor record, const Wanted *wanted, int64_t row, float *out_row, Table *labels,
                      Cursor *id) {
    FloatRow state = {wanted, out_row, 0};
    /* each key is seen at most once: all were seen where as many were copied */
    return walk_features(record, wanted, row, labels, id, copy_feature, &state) && state.seen == wanted->num_features;
}

/* ---- Batch decoders: the records data[starts[i]:ends[i]], each marked decoded in ok[i] with its id's bounds ---- */

typedef struct {
    Py_buffer data, starts, ends, ok, id_starts, id_sizes;
    Py_ssize_t count;
} Records;

/* Check the shared arrays' sizes and the records' bounds; false with an exception set. */
static int check_records(Records *records) {
    Py_ssize_t count = records->count = records->starts.len / 8;
    const int64_t *starts = records->starts.buf, *ends = records->ends.buf;
    int valid = records->ends.len == count * 8 && records->ok.len >= count && records->id_starts.len >= count * 8 &&
                records->id_sizes.len >= count * 8;
    for (Py_ssize_t i = 0; valid && i < count; i++)
        valid = starts[i] >= 0 && starts[i] <= ends[i] && ends[i] <= records->data.len;
    if (!valid) PyErr_SetString(PyExc_ValueError, "native decoder: array sizes or record bounds do not match");
    return valid;
}

static void release_records(Records *records) {
    PyBuffer_Release(&records->data);
    PyBuffer_Release(&records->starts);
    PyBuffer_Release(&records->ends);
    PyBuffer_Release(&records->ok);
    PyBuffer_Release(&records->id_starts);
    PyBuffer_Release(&records->id_sizes);
}

/* What a features decoder holds when it returns: its table, records, and wanted sizes, offsets and output. */
static void release_decoding(Table *table, Records *records, Py_buffer *sizes, Py_buffer *offsets, Py_buffer *out) {
    free_table(table);
    release_records(records);
    PyBuffer_Release(sizes);
    PyBuffer_Release(offsets);
    PyBuffer_Release(out);
}

/* Decode one record as `row`, its id's bounds into `id`: false where the Python decoder must take it. */
typedef int (*RecordDecoder)(void *state, Py_ssize_t row, Cursor record, Table *table, Cursor *id);

/* Decode every record, without the GIL; a record not decoded has its rows of `table` rolled back. Returns the
 * table's columns, or NULL with an exception set. */
static PyObject *decode_all(Records *records, Table *table, RecordDecoder decode, void *state) {
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *bytes = records->data.buf;
    for (Py_ssize_t row = 0; row < records->count; row++) {
        Cursor record = {bytes + ((int64_t *)records->starts.buf)[row], bytes + ((int64_t *)records->ends.buf)[row]};
        Cursor id;
        Py_ssize_t rows_before = table->count;
        int decoded = decode(state, row, record, table, &id);
        ((uint8_t *)records->ok.buf)[row] = (uint8_t)decoded;
        if (decoded) {
            ((int64_t *)records->id_starts.buf)[row] = id.p - bytes;
            ((int64_t *)records->id_sizes.buf)[row] = id.end - id.p;
        } else {
            table->count = rows_before;
        }
        if (table->failed) break;
    }
    Py_END_ALLOW_THREADS
    if (table->failed) return PyErr_NoMemory();
    return table_columns(table);
}

static void fixed_keys(Wanted *wanted, Py_ssize_t count, Py_ssize_t num_classes) {
    static const char *fixed[] = {"labels", "id", "video_id"};
    wanted->num_features = count;
    wanted->num_keys = count + 3;
    wanted->num_classes = num_classes;
    for (int i = 0; i < 3; i++) {
        wanted->keys[count + i] = fixed[i];
        wanted->key_sizes[count + i] = (Py_ssize_t)strlen(fixed[i]);
    }
}

/* The wanted features (keys, their sizes and first columns), then "labels", "id", "video_id". */
static int parse_wanted(PyObject *keys, Py_buffer *sizes, Py_buffer *offsets, Py_ssize_t num_classes,
                        Wanted *wanted) {
    Py_ssize_t count = PyTuple_Size(keys);
    if (count < 0) return 0;
    if (count + 3 > MAX_KEYS || sizes->len != count * 8 || offsets->len != count * 8 || num_classes < 1) {
        PyErr_SetString(PyExc_ValueError, "native decoder: keys, sizes and offsets must match (at most 61)");
        return 0;
    }
    fixed_keys(wanted, count, num_classes);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "native decoder: keys must be bytes");
            return 0;
        }
        wanted->keys[i] = PyBytes_AS_STRING(key);
        wanted->key_sizes[i] = PyBytes_GET_SIZE(key);
        wanted->float_sizes[i] = ((int64_t *)sizes->buf)[i];
        wanted->float_offsets[i] = ((int64_t *)offsets->buf)[i];
    }
    return 1;
}

/* Whether every wanted feature's [offset, offset + size) lies within a row of `width` values. */
static int features_fit(const Wanted *wanted, Py_ssize_t width) {
    for (Py_ssize_t i = 0; i < wanted->num_features; i++)
        if (wanted->float_offsets[i] < 0 || wanted->float_sizes[i] < 0 ||
            wanted->float_offsets[i] + wanted->float_sizes[i] > width)
            return 0;
    return 1;
}

/* ---- Video level: Examples into float32 rows ---- */

typedef struct {
    const Wanted *wanted;
    float *out;
    Py_ssize_t row_floats;
} VideoRows;

static int decode_video_row(void *state, Py_ssize_t row, Cursor record, Table *labels, Cursor *id) {
    VideoRows *rows = state;
    return decode_one(record, rows->wanted, row, rows->out + row * rows->row_floats, labels, id);
}

PyDoc_STRVAR(decode_examples_doc,
"decode_examples(data, starts, ends, keys, float_sizes, float_offsets, num_classes, out, ok, id_starts,\n"
"                id_sizes) -> (label_rows, label_values)\n\n"
"Decode the video-level Examples data[starts[i]:ends[i]]: feature keys[j] (float_sizes[j] floats) into\n"
"out[i, float_offsets[j]:], the id's bounds in data into id_starts/id_sizes, ok[i] = 1 where record i was\n"
"decoded. Labels come back as two bytes objects of int64 (row, label id), in stored order. A record not\n"
"decoded (ok[i] = 0: anything unusual, damaged, or a NaN or infinite value) may have had part of its row written.");

static PyObject *decode_examples(PyObject *self, PyObject *args) {
    Records records;
    Py_buffer sizes, offsets, out;
    PyObject *keys, *result = NULL;
    Py_ssize_t num_classes;
    if (!PyArg_ParseTuple(args, "y*y*y*O!y*y*nw*w*w*w*", &records.data, &records.starts, &records.ends,
                          &PyTuple_Type, &keys, &sizes, &offsets, &num_classes, &out, &records.ok,
                          &records.id_starts, &records.id_sizes))
        return NULL;
    Table labels = {{NULL}, 2, 0, 0, 0};
    Wanted wanted;
    if (!parse_wanted(keys, &sizes, &offsets, num_classes, &wanted) || !check_records(&records)) goto done;
    Py_ssize_t count = records.count, row_floats = count ? out.len / 4 / count : 0;
    if (out.len != count * row_floats * 4 || (count && !features_fit(&wanted, row_floats))) {
        PyErr_SetString(PyExc_ValueError, "decode_examples: the output does not fit the records and features");
        goto done;
    }
    VideoRows rows = {&wanted, out.buf, row_floats};
    result = decode_all(&records, &labels, decode_video_row, &rows);
done:
    release_decoding(&labels, &records, &sizes, &offsets, &out);
    return result;
}

/* ---- Frame level: SequenceExamples into uint8 [frames, bytes] rows ---- */

/* The one value of a frame's Feature: a BytesList of one value of `size` bytes; false for anything else. */
static int frame_value(Cursor feature, int64_t size, const uint8_t **value) {
    uint64_t number, ignored;
    int wire, kinds = 0;
    Cursor content, list = {NULL, NULL}, bytes;
    while (feature.p < feature.end) {
        if (!next_field(&feature, &number, &wire, &ignored, &content)) return 0;
        if (number < KIND_BYTES || number > KIND_INT64) continue;
        if (number != KIND_BYTES || wire != WIRE_LEN || kinds++) return 0;
        list = content;
    }
    if (!kinds || !single_bytes(list, &bytes) || bytes.end - bytes.p != size) return 0;
    *value = bytes.p;
    return 1;
}

/* Copy a FeatureList's frames, `size` bytes each, frame i to rows + i * row_bytes while i < max_frames; every frame
 * is checked. The number of frames, or -1 where one is not a single value of `size` bytes. */
static int64_t copy_frames(Cursor list, int64_t size, uint8_t *rows, int64_t row_bytes, int64_t max_frames) {
    uint64_t number, ignored;
    int wire;
    Cursor frame;
    int64_t count = 0;
    while (list.p < list.end) {
        if (!next_field(&list, &number, &wire, &ignored, &frame)) return -1;
        if (number != 1) continue;
        const uint8_t *value;
        if (wire != WIRE_LEN || !frame_value(frame, size, &value)) return -1;
        if (count < max_frames) memcpy(rows + count * row_bytes, value, (size_t)size);
        count++;
    }
    return count;
}

/* A FeatureLists map entry's key and FeatureList (empty where it has none); false for repeated parts. */
static int read_list_entry(Cursor entry, Cursor *key, Cursor *list) {
    uint64_t number, ignored;
    int wire, seen_key = 0, seen_list = 0;
    Cursor content;
    key->p = key->end = list->p = list->end = entry.p;
    while (entry.p < entry.end) {
        if (!next_field(&entry, &number, &wire, &ignored, &content)) return 0;
        if (number != 1 && number != 2) continue;
        if (wire != WIRE_LEN || (number == 1 ? seen_key++ : seen_list++)) return 0;
        *(number == 1 ? key : list) = content;
    }
    return 1;
}

typedef struct {
    Wanted lists, context; /* feature lists: keys, bytes per frame (float_sizes) and first byte (float_offsets) */
    uint8_t *out;
    int64_t row_bytes, row_frames, max_frames;
    int64_t *num_frames;
} FrameRows;

/* The record's feature lists into its row: the first max_frames frames, then zeros up to row_frames. */
static int decode_frame_lists(const FrameRows *rows, Cursor record, uint8_t *row, int64_t *frames_out) {
    uint64_t number, ignored;
    int wire, seen_lists = 0, seen[MAX_KEYS] = {0};
    Cursor content, lists = {NULL, NULL}, key, list;
    while (record.p < record.end) {
        if (!next_field(&record, &number, &wire, &ignored, &content)) return 0;
        if (number != 2) continue;
        if (wire != WIRE_LEN || seen_lists++) return 0;
        lists = content;
    }
    int64_t frames = -1;
    const Wanted *wanted = &rows->lists;
    while (lists.p < lists.end) {
        if (!next_field(&lists, &number, &wire, &ignored, &content)) return 0;
        if (number != 1) continue;
        if (wire != WIRE_LEN || !read_list_entry(content, &key, &list)) return 0;
        Py_ssize_t index = find_key(wanted, key);
        if (index < 0 || index >= wanted->num_features) continue;
        if (seen[index]++) return 0;
        int64_t count = copy_frames(list, wanted->float_sizes[index], row + wanted->float_offsets[index],
                                    rows->row_bytes, rows->max_frames);
        if (count < 0 || (frames >= 0 && count != frames)) return 0;
        frames = count;
    }
    for (Py_ssize_t i = 0; i < wanted->num_features; i++)
        if (!seen[i]) return 0;
    int64_t kept = frames < 0 ? 0 : frames < rows->max_frames ? frames : rows->max_frames;
    memset(row + kept * rows->row_bytes, 0, (size_t)((rows->row_frames - kept) * rows->row_bytes));
    *frames_out = kept;
    return 1;
}

static int no_context_features(void *state, Py_ssize_t index, int kind, Cursor list) {
    return 0;
}

static int decode_frame_row(void *state, Py_ssize_t row, Cursor record, Table *labels, Cursor *id) {
    FrameRows *rows = state;
    return walk_features(record, &rows->context, row, labels, id, no_context_features, NULL) &&
           decode_frame_lists(rows, record, rows->out + row * rows->row_frames * rows->row_bytes,
                              rows->num_frames + row);
}

PyDoc_STRVAR(decode_sequence_examples_doc,
"decode_sequence_examples(data, starts, ends, keys, sizes, offsets, num_classes, max_frames, out, num_frames,\n"
"                         ok, id_starts, id_sizes) -> (label_rows, label_values)\n\n"
"Decode the frame-level SequenceExamples data[starts[i]:ends[i]] into out (uint8 [records, row_frames, width]):\n"
"feature list keys[j] (sizes[j] bytes per frame) into out[i, :, offsets[j]:], its first max_frames frames\n"
"(every frame is checked), zeros after them; num_frames[i] the frames kept. Ids and labels as decode_examples.\n"
"A record not decoded (ok[i] = 0) may have had part of its row written.");

static PyObject *decode_sequence_examples(PyObject *self, PyObject *args) {
    Records records;
    Py_buffer sizes, offsets, out, num_frames;
    PyObject *keys, *result = NULL;
    Py_ssize_t num_classes, max_frames;
    if (!PyArg_ParseTuple(args, "y*y*y*O!y*y*nnw*w*w*w*w*", &records.data, &records.starts, &records.ends,
                          &PyTuple_Type, &keys, &sizes, &offsets, &num_classes, &max_frames, &out, &num_frames,
                          &records.ok, &records.id_starts, &records.id_sizes))
        return NULL;
    Table labels = {{NULL}, 2, 0, 0, 0};
    FrameRows rows;
    if (!parse_wanted(keys, &sizes, &offsets, num_classes, &rows.lists) || !check_records(&records)) goto done;
    fixed_keys(&rows.context, 0, num_classes);
    Py_ssize_t count = records.count, width = 0;
    for (Py_ssize_t i = 0; i < rows.lists.num_features; i++)
        if (rows.lists.float_offsets[i] + rows.lists.float_sizes[i] > width)
            width = rows.lists.float_offsets[i] + rows.lists.float_sizes[i];
    Py_ssize_t row_frames = count && width ? out.len / count / width : 0;
    int fits = out.len == count * row_frames * width && num_frames.len >= count * 8 && max_frames >= 0 &&
               max_frames <= row_frames && width > 0;
    if (count && !fits) {
        PyErr_SetString(PyExc_ValueError, "decode_sequence_examples: the output does not fit the records");
        goto done;
    }
    rows.out = out.buf;
    rows.row_bytes = width;
    rows.row_frames = row_frames;
    rows.max_frames = max_frames;
    rows.num_frames = num_frames.buf;
    result = decode_all(&records, &labels, decode_frame_row, &rows);
done:
    release_decoding(&labels, &records, &sizes, &offsets, &out);
    PyBuffer_Release(&num_frames);
    return result;
}

/* ---- 2019 segment ratings: a SequenceExample's context, frames not read ---- */

enum { RATED_STARTS = 0, RATED_CLASSES = 1, RATED_SCORES = 2 };

typedef struct {
    Cursor lists[3]; /* segment_start_times, segment_labels, segment_scores; empty where absent */
    int kinds[3];
} Ratings;

static int keep_ratings_list(void *state, Py_ssize_t index, int kind, Cursor list) {
    Ratings *ratings = state;
    ratings->lists[index] = list;
    ratings->kinds[index] = kind;
    return 1;
}

/* The next int64 of an Int64List (packed or not) below `limit` (as uint64: negative values are out of range):
 * 1, 0 at the list's end, -1 for anything else. `packed` carries a packed run between calls. */
static int next_int64(Cursor *list, Cursor *packed, uint64_t limit, int64_t *out) {
    uint64_t value = 0; /* set by next_value wherever it is read; initialized for compilers that cannot tell */
    int wire, found;
    while (packed->p >= packed->end) {
        found = next_value(list, &wire, &value, packed);
        if (found <= 0) return found;
        if (wire == WIRE_VARINT) {
            packed->p = packed->end = NULL;
            if (value >= limit) return -1;
            *out = (int64_t)value;
            return 1;
        }
        if (wire != WIRE_LEN) return -1;
    }
    if (!read_varint(packed, &value) || value >= limit) return -1;
    *out = (int64_t)value;
    return 1;
}

/* The next rating of a FloatList (packed or not), 0 or 1 (-0.0 counts as 0): 1, 0 at the end, -1 otherwise. */
static int next_rating(Cursor *list, Cursor *packed, int64_t *out) {
    uint64_t ignored;
    int wire, found;
    while (packed->p >= packed->end) {
        found = next_value(list, &wire, &ignored, packed);
        if (found <= 0) return found;
        if ((wire != WIRE_LEN && wire != WIRE_FIXED32) || (packed->end - packed->p) % 4) return -1;
    }
    uint32_t bits = load_u32(packed->p);
    packed->p += 4;
    if ((bits & 0x7FFFFFFFu) != 0 && bits != 0x3F800000u) return -1;
    *out = bits == 0x3F800000u;
    return 1;
}

static int decode_ratings_row(void *state, Py_ssize_t row, Cursor record, Table *ratings, Cursor *id) {
    const Wanted *wanted = state;
    Ratings found = {{{NULL, NULL}, {NULL, NULL}, {NULL, NULL}}, {KIND_NONE, KIND_NONE, KIND_NONE}};
    if (!walk_features(record, wanted, row, NULL, id, keep_ratings_list, &found)) return 0;
    static const int expected[3] = {KIND_INT64, KIND_INT64, KIND_FLOAT};
    for (int i = 0; i < 3; i++)
        if (found.kinds[i] != KIND_NONE && found.kinds[i] != expected[i]) return 0;
    Cursor packed[3] = {{NULL, NULL}, {NULL, NULL}, {NULL, NULL}};
    uint64_t limits[2] = {(uint64_t)INT64_MAX + 1, (uint64_t)wanted->num_classes};
    while (1) {
        int64_t values[4] = {row, 0, 0, 0};
        int more[3];
        for (int i = 0; i < 2; i++) more[i] = next_int64(&found.lists[i], &packed[i], limits[i], values + 1 + i);
        more[2] = next_rating(&found.lists[RATED_SCORES], &packed[2], values + 3);
        if (more[0] < 0 || more[1] < 0 || more[2] < 0 || more[0] != more[1] || more[1] != more[2]) return 0;
        if (!more[0]) return 1;
        if (!push_row(ratings, values)) return 0;
    }
}

PyDoc_STRVAR(decode_segment_ratings_doc,
"decode_segment_ratings(data, starts, ends, num_classes, ok, id_starts, id_sizes) -> (rows, starts, classes,\n"
"                                                                                    ratings)\n\n"
"The 2019 segment ratings of the SequenceExamples data[starts[i]:ends[i]], frames not read: one (record, segment\n"
"start, class, rating 0 or 1) per rated pair, in stored order, as four bytes objects of int64; ids as\n"
"decode_examples. A record with anything unusual (lists of different lengths, a class outside [0, num_classes),\n"
"a rating other than 0 or 1, a negative start) is not decoded (ok[i] = 0). Repeated pairs are kept.");

static PyObject *decode_segment_ratings(PyObject *self, PyObject *args) {
    Records records;
    Py_ssize_t num_classes;
    if (!PyArg_ParseTuple(args, "y*y*y*nw*w*w*", &records.data, &records.starts, &records.ends, &num_classes,
                          &records.ok, &records.id_starts, &records.id_sizes))
        return NULL;
    static const char *segment_keys[3] = {"segment_start_times", "segment_labels", "segment_scores"};
    Table ratings = {{NULL}, 4, 0, 0, 0};
    PyObject *result = NULL;
    Wanted wanted;
    fixed_keys(&wanted, 3, num_classes);
    for (int i = 0; i < 3; i++) {
        wanted.keys[i] = segment_keys[i];
        wanted.key_sizes[i] = (Py_ssize_t)strlen(segment_keys[i]);
    }
    if (num_classes < 1) PyErr_SetString(PyExc_ValueError, "decode_segment_ratings: num_classes must be positive");
    else if (check_records(&records)) result = decode_all(&records, &ratings, decode_ratings_row, &wanted);
    free_table(&ratings);
    release_records(&records);
    return result;
}

static PyMethodDef methods[] = {
    {"frame_records", frame_records, METH_VARARGS, frame_records_doc},
    {"decode_examples", decode_examples, METH_VARARGS, decode_examples_doc},
    {"decode_sequence_examples", decode_sequence_examples, METH_VARARGS, decode_sequence_examples_doc},
    {"decode_segment_ratings", decode_segment_ratings, METH_VARARGS, decode_segment_ratings_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "yt8m.data.format._native", .m_size = -1,
                                    .m_methods = methods};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *crc32c = PyImport_ImportModule("crc32c");
    if (crc32c == NULL) return NULL;
    crc32c_function = PyObject_GetAttrString(crc32c, "crc32c");
    Py_DECREF(crc32c);
    if (crc32c_function == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "FRAME_LIMIT", FRAME_LIMIT) < 0 ||
        PyModule_AddIntConstant(m, "FRAME_NEED_BYTES", FRAME_NEED_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "FRAME_BAD_LENGTH_CRC", FRAME_BAD_LENGTH_CRC) < 0 ||
        PyModule_AddIntConstant(m, "FRAME_BAD_PAYLOAD_CRC", FRAME_BAD_PAYLOAD_CRC) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
