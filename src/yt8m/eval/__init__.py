"""Evaluation: the competition metrics (GAP, mAP, Hit@1, PERR; segment mAP), scoring prediction files, and
evaluating a checkpoint over labelled shards."""
