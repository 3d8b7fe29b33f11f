"""State only (the models are unmanaged): the states ``delivered``, ``undelivered`` and
``suppressed``, as Alembic revision 0006_receipts adds them with the delivery receipts."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery_outbox", "0004_audit")]

    operations = [
        migrations.AlterField(
            model_name="message",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "pending"),
                    ("dispatched", "dispatched"),
                    ("sending", "sending"),
                    ("sent", "sent"),
                    ("dead", "dead"),
                    ("unknown", "unknown"),
                    ("cancelled", "cancelled"),
                    ("expired", "expired"),
                    ("delivered", "delivered"),
                    ("undelivered", "undelivered"),
                    ("suppressed", "suppressed"),
                ],
                max_length=16,
            ),
        ),
    ]
