"""Pre-training data: corpus -> shards -> NSP/MLM instances -> batches."""
