"""Several processes: the torchrun process group (ranks, collectives, relaunching under torchrun) and
eval/predict split over ranks."""
