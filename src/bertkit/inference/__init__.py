"""Using a trained model: labels, spans and tags (`predict`), fill-mask, sentence vectors
(`embedder`), frozen features (`features`), the pictures of insight, and the ONNX export. Every
model folder is opened by `loader`."""
