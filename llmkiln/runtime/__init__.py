"""CPU runtime: drives an engine folder's ONNX graph with onnxruntime."""
