"""Example apps using ``delivery``: ``examples.flask_app`` and ``examples.django_app``."""
