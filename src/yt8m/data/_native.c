/* The data layer's two hot loops in C: TFRecord framing of a whole buffer, and decoding of video-level Examples
 * straight into a batch's float32 rows.
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

typedef struct {
    int64_t *rows, *values;
    Py_ssize_t count, capacity;
    int failed; /* out of memory */
} Labels;

static int push_label(Labels *labels, int64_t row, int64_t value) {
    if (labels->count == labels->capacity) {
        Py_ssize_t capacity = labels->capacity ? 2 * labels->capacity : 4096;
        int64_t *rows = realloc(labels->rows, capacity * sizeof(int64_t));
        if (rows != NULL) labels->rows = rows;
        int64_t *values = rows == NULL ? NULL : realloc(labels->values, capacity * sizeof(int64_t));
        if (values == NULL) {
            labels->failed = 1;
            return 0;
        }
        labels->values = values;
        labels->capacity = capacity;
    }
    labels->rows[labels->count] = row;
    labels->values[labels->count++] = value;
    return 1;
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
static int read_labels(Cursor list, int64_t row, int64_t num_classes, Labels *labels) {
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

/* Decode one Example into `row`: its floats, id bounds and labels; false (labels rolled back) where the Python
 * decoder must take it: anything malformed, missing, repeated, of another kind or size, or out of range. */
static int decode_one(Cursor record, const Wanted *wanted, int64_t row, float *out_row, Labels *labels,
                      Cursor *id) {
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
        if (index < 0) continue;
        if (seen[index]++) return 0; /* a repeated key: protobuf's last-wins is left to Python */
        if (index < labels_key) {
            if (kind != KIND_FLOAT ||
                !copy_floats(list, out_row + wanted->float_offsets[index], wanted->float_sizes[index]))
                return 0;
        } else if (index == labels_key) {
            if (kind == KIND_NONE) continue;
            if (kind != KIND_INT64 || !read_labels(list, row, wanted->num_classes, labels)) return 0;
        } else {
            if (kind != KIND_BYTES || !single_bytes(list, &ids[index - labels_key - 1])) return 0;
        }
    }
    for (Py_ssize_t i = 0; i < labels_key; i++)
        if (!seen[i]) return 0;
    if (!seen[labels_key + 1] && !seen[labels_key + 2]) return 0;
    *id = seen[labels_key + 1] ? ids[0] : ids[1];
    return 1;
}

PyDoc_STRVAR(decode_examples_doc,
"decode_examples(data, starts, ends, keys, float_sizes, float_offsets, num_classes, out, ok, id_starts,\n"
"                id_sizes) -> (label_rows, label_values)\n\n"
"Decode the video-level Examples data[starts[i]:ends[i]]: feature keys[j] (float_sizes[j] floats) into\n"
"out[i, float_offsets[j]:], the id's bounds in data into id_starts/id_sizes, ok[i] = 1 where record i was\n"
"decoded. Labels come back as two bytes objects of int64 (row, label id), in stored order. A record not\n"
"decoded (ok[i] = 0: anything unusual, damaged, or a NaN or infinite value) may have had part of its row written.");

static int parse_wanted(PyObject *keys, Py_buffer *sizes, Py_buffer *offsets, Py_ssize_t num_classes,
                        Wanted *wanted) {
    static const char *fixed[] = {"labels", "id", "video_id"};
    Py_ssize_t count = PyTuple_Size(keys);
    if (count < 0) return 0;
    if (count + 3 > MAX_KEYS || sizes->len != count * 8 || offsets->len != count * 8 || num_classes < 1) {
        PyErr_SetString(PyExc_ValueError, "decode_examples: keys, sizes and offsets must match (at most 61)");
        return 0;
    }
    wanted->num_features = count;
    wanted->num_keys = count + 3;
    wanted->num_classes = num_classes;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "decode_examples: keys must be bytes");
            return 0;
        }
        wanted->keys[i] = PyBytes_AS_STRING(key);
        wanted->key_sizes[i] = PyBytes_GET_SIZE(key);
        wanted->float_sizes[i] = ((int64_t *)sizes->buf)[i];
        wanted->float_offsets[i] = ((int64_t *)offsets->buf)[i];
    }
    for (int i = 0; i < 3; i++) {
        wanted->keys[count + i] = fixed[i];
        wanted->key_sizes[count + i] = (Py_ssize_t)strlen(fixed[i]);
    }
    return 1;
}

static PyObject *decode_examples(PyObject *self, PyObject *args) {
    Py_buffer data, starts, ends, sizes, offsets, out, ok, id_starts, id_sizes;
    PyObject *keys, *result = NULL;
    Py_ssize_t num_classes;
    if (!PyArg_ParseTuple(args, "y*y*y*O!y*y*nw*w*w*w*", &data, &starts, &ends, &PyTuple_Type, &keys, &sizes,
                          &offsets, &num_classes, &out, &ok, &id_starts, &id_sizes))
        return NULL;
    Labels labels = {NULL, NULL, 0, 0, 0};
    Wanted wanted;
    if (!parse_wanted(keys, &sizes, &offsets, num_classes, &wanted)) goto done;
    Py_ssize_t count = starts.len / 8, row_floats = count ? out.len / 4 / count : 0;
    int valid = ends.len == count * 8 && ok.len >= count && id_starts.len >= count * 8 && id_sizes.len >= count * 8 &&
                out.len == count * row_floats * 4;
    for (Py_ssize_t i = 0; valid && count && i < wanted.num_features; i++)
        valid = wanted.float_offsets[i] >= 0 && wanted.float_sizes[i] >= 0 &&
                wanted.float_offsets[i] + wanted.float_sizes[i] <= row_floats;
    for (Py_ssize_t i = 0; valid && i < count; i++)
        valid = ((int64_t *)starts.buf)[i] >= 0 && ((int64_t *)starts.buf)[i] <= ((int64_t *)ends.buf)[i] &&
                ((int64_t *)ends.buf)[i] <= data.len;
    if (!valid) {
        PyErr_SetString(PyExc_ValueError, "decode_examples: array sizes or record bounds do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *bytes = data.buf;
    for (Py_ssize_t row = 0; row < count; row++) {
        Cursor record = {bytes + ((int64_t *)starts.buf)[row], bytes + ((int64_t *)ends.buf)[row]}, id;
        Py_ssize_t labels_before = labels.count;
        int decoded = decode_one(record, &wanted, row, (float *)out.buf + row * row_floats, &labels, &id);
        ((uint8_t *)ok.buf)[row] = (uint8_t)decoded;
        if (decoded) {
            ((int64_t *)id_starts.buf)[row] = id.p - bytes;
            ((int64_t *)id_sizes.buf)[row] = id.end - id.p;
        } else {
            labels.count = labels_before;
        }
        if (labels.failed) break;
    }
    Py_END_ALLOW_THREADS
    if (labels.failed) {
        PyErr_NoMemory();
        goto done;
    }
    /* y# makes None of a NULL pointer: no labels at all must still be two empty bytes objects */
    result = Py_BuildValue("y#y#", labels.count ? (const char *)labels.rows : "", labels.count * 8,
                           labels.count ? (const char *)labels.values : "", labels.count * 8);
done:
    free(labels.rows);
    free(labels.values);
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&out);
    PyBuffer_Release(&ok);
    PyBuffer_Release(&id_starts);
    PyBuffer_Release(&id_sizes);
    return result;
}

static PyMethodDef methods[] = {
    {"frame_records", frame_records, METH_VARARGS, frame_records_doc},
    {"decode_examples", decode_examples, METH_VARARGS, decode_examples_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "yt8m.data._native", .m_size = -1,
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
