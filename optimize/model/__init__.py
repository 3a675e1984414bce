"""The model as a file and as a thing to run: ONNX reading and writing (`onnx_file`), what a graph
holds and costs (`inspection`), and a model in a runtime, the one type every command passes
around (`runtime_model`)."""
