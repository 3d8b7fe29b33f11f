"""State only (the models are unmanaged): message type, priority and time-to-live, as
Alembic revision 0002 adds them to ``delivery_messages``."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery_outbox", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="message",
            name="message_type",
            field=models.CharField(max_length=32, null=True),
        ),
        migrations.AddField(
            model_name="message",
            name="priority",
            field=models.CharField(default="normal", max_length=16),
        ),
        migrations.AddField(
            model_name="message",
            name="expires_at",
            field=models.DateTimeField(null=True),
        ),
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
                ],
                max_length=16,
            ),
        ),
    ]
