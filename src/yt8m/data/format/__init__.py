"""The YouTube-8M file format, read and written without TensorFlow: TFRecord framing (tfrecord), the protobuf wire
format of tf.train.Example and SequenceExample (wire, wire_scan, layout, example_parse, encode), records decoded as
YT8M defines them (decode), and whole batches decoded by the native decoder (batch_decode, _native.c)."""
