"""State only (the models are unmanaged): ``pinned`` and ``Attempt.provider``, as Alembic
revision 0007_failover adds them."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery_outbox", "0006_receipt")]

    operations = [
        migrations.AddField(
            model_name="message",
            name="pinned",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="attempt",
            name="provider",
            field=models.CharField(max_length=64, null=True),
        ),
    ]
