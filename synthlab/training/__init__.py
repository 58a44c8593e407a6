"""Training a model: typed configs, run folders, optimizer and schedules, the one training engine, torchrun, checkpoints, loggers, the lab's trainer and its objectives."""
