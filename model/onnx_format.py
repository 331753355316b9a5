"""Where the ONNX export lives inside a model directory; shared by the exporter (torch) and the ONNX
Runtime encoder (no torch), so neither has to import the other."""

ONNX_DIR = "onnx"
TEXT_GRAPH = "text_encoder.onnx"
IMAGE_GRAPH = "image_encoder.onnx"
FUSION_GRAPH = "fusion_scorer.onnx"
EXPORT_MANIFEST = "export.json"
TEXT_GRAPH_INT8 = "text_encoder.int8.onnx"
FUSION_GRAPH_INT8 = "fusion_scorer.int8.onnx"
