"""The K3 model and its training algorithms: plain Python + torch (no dagster, ray or mlflow)."""
