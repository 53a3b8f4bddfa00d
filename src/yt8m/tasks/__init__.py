"""Tasks: what a model learns and is judged on (labels, loss, metrics), behind one protocol: video labels,
segment ratings, vocabulary-mapped labels, a teacher's soft targets, and several of them at once."""
