"""Calibration and quality: calibration/evaluation sets, KV scales, ModelOpt FP8, the quality diff, the build stage.

Modules import their heavy dependencies (torch, ModelOpt, onnxruntime) inside functions, so importing this
package stays cheap.
"""
