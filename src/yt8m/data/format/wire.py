"""The protobuf facts of tf.train.Example / SequenceExample that the YT8M encoders and decoders share:
field numbers of tensorflow/core/example/{example,feature}.proto, wire types, and YT8M's feature keys."""

EXAMPLE_FEATURES = 1
SEQUENCE_CONTEXT = 1
SEQUENCE_FEATURE_LISTS = 2
MAP_ENTRY = 1  # Features.feature and FeatureLists.feature_list are both field 1
ENTRY_KEY = 1
ENTRY_VALUE = 2
KIND_BYTES = 1
KIND_FLOAT = 2
KIND_INT64 = 3
LIST_VALUE = 1  # BytesList/FloatList/Int64List.value and FeatureList.feature

WIRE_VARINT = 0
WIRE_FIXED64 = 1
WIRE_LEN = 2
WIRE_GROUP_START = 3
WIRE_GROUP_END = 4
WIRE_FIXED32 = 5

ID_KEYS = (b"id", b"video_id")  # 2018 and later, 2017
LABELS_KEY = b"labels"
# The 2019 segment ratings in a SequenceExample's context: one entry per rated (segment, class) pair.
SEGMENT_START_TIMES_KEY = b"segment_start_times"
SEGMENT_LABELS_KEY = b"segment_labels"
SEGMENT_SCORES_KEY = b"segment_scores"
UINT64_MASK = (1 << 64) - 1  # varints carry 64 bits; negative int64 values take all ten bytes
