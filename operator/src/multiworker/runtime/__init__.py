"""Helpers for training scripts running inside MultiWorkerJob worker pods (stdlib + TensorFlow only)."""
