"""`tracking`: MLflow lineage and metrics."""

from vtg.config._base import Section


class TrackingConfig(Section):
    tracking_uri: str = "sqlite:///mlflow.db"
    """MLflow tracking URI (SQLite here; an http:// server in production)."""
    experiment: str = "vtg-posttrain"
    """MLflow experiment name."""
    registered_model: str = "vtg-grounding"
    """Model registry name for the best checkpoint."""
    enabled: bool = True
    """Turn MLflow logging off (e.g. for quick debugging)."""
