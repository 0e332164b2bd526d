from django.apps import AppConfig


class ImportsConfig(AppConfig):
    """Evidence from where it was produced: runs read from other tools' files (prime-rl, verl, TRL,
    TensorBoard, MLflow, W&B, Trackio) into a team's experiment, read-only, with their provenance;
    and the lab's runs mirrored out to MLflow and TensorBoard."""

    name = "imports"
