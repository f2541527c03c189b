"""multiworker: run TensorFlow MultiWorkerMirroredStrategy training as one Kubernetes resource."""
