"""Fine-tuning: one run (`train`), its settings (`config`), several runs (`runs`), scoring a
split or a saved model (`evaluation`) and the model card of a fine-tuned folder (`model_card`)."""
