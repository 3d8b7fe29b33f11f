"""State only (the models are unmanaged): the delivery receipts table, which Alembic revision
0006_receipts creates, read by the admin's message page."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery_outbox", "0005_receipts")]

    operations = [
        migrations.CreateModel(
            name="Receipt",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("provider", models.CharField(max_length=64)),
                ("event", models.CharField(max_length=255)),
                ("status", models.CharField(max_length=16)),
                ("code", models.CharField(max_length=64, null=True)),
                ("provider_at", models.DateTimeField(null=True)),
                ("received_at", models.DateTimeField()),
                ("effect", models.CharField(max_length=16)),
                (
                    "message",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="receipts",
                        to="delivery_outbox.message",
                    ),
                ),
            ],
            options={
                "verbose_name": "delivery receipt",
                "db_table": "delivery_receipts",
                "ordering": ("id",),
                "managed": False,
            },
        ),
    ]
