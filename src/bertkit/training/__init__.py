"""The one training loop (pre-training and fine-tuning), its optimiser and distribution."""
