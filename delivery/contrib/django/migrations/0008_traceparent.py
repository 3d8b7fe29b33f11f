"""State only (the models are unmanaged): ``Message.traceparent``, as Alembic revision
0008_traceparent adds it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery_outbox", "0007_failover")]

    operations = [
        migrations.AddField(
            model_name="message",
            name="traceparent",
            field=models.CharField(max_length=55, null=True),
        ),
    ]
