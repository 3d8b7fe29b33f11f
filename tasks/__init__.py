"""The deployment's Celery entry point: ``celery -A tasks worker|beat`` in docker-compose.yml,
deploy/ and the examples. The app lives in the installed package (``delivery.worker``); this
folder is not part of the wheel."""

from delivery.worker import app

__all__ = ["app"]
