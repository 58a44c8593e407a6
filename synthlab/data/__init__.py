"""Datasets on disk to training batches: the word tokenizer, datasets and packing, the next epoch packed ahead."""
