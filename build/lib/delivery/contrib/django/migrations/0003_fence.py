"""State only (the models are unmanaged): ``budget_start``, as Alembic revision 0003_fence
adds it to ``delivery_messages``."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery_outbox", "0002_types_ttl")]

    operations = [
        migrations.AddField(
            model_name="message",
            name="budget_start",
            field=models.IntegerField(default=0),
        ),
    ]
