"""The worker runtime on a GPU host: an ONNX Runtime session that serves batches (`session.OnnxSession`) and
the per-instance batcher that drives one of the planning engine's batching policies exactly as the
simulator does (`batcher.InstanceBatcher`). Imports nothing from Django or the control plane; the pure
engine (`engine.dataplane.batching`) is the one shared piece."""
