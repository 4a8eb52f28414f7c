"""The Triton model repository, defined once: its layout on disk (config file, version folders, model file
names, the exporter's manifest, the publish lock), its ``config.pbtxt`` and Triton's model-control API.

The exporter writes repositories through it, the gateway and the local Triton read them through it. It
imports neither torch nor onnx: a serving node needs it without the exporter's toolchain.
"""
