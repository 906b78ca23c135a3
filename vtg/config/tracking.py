"""`tracking`: MLflow lineage and metrics."""

from pydantic import Field

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
    artifacts_dir: str = "mlartifacts"
    """Artifact root of the MLflow server that `make serve` starts."""
    server_port: int = Field(5000, ge=1, le=65535)
    """Port of the MLflow server that `make serve` starts on 127.0.0.1."""
