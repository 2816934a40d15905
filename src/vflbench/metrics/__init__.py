"""Leaf metrics: AUC in batches, reconstruction quality (MSE, SSIM), leakage and Kang's PU and DCS scores.

Pure functions of tensors and numbers; nothing here imports another vflbench package.
"""
