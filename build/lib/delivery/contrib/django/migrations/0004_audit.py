"""State only (the models are unmanaged): the audit of operator actions, as Alembic revision
0004_audit creates ``delivery_audit``."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery_outbox", "0003_fence")]

    operations = [
        migrations.CreateModel(
            name="AuditEntry",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("at", models.DateTimeField()),
                ("actor", models.CharField(max_length=128)),
                ("action", models.CharField(max_length=32)),
                ("message_id", models.BigIntegerField(null=True)),
                ("message_key", models.CharField(max_length=255, null=True)),
                ("from_status", models.CharField(max_length=16, null=True)),
                ("to_status", models.CharField(max_length=16, null=True)),
                ("detail", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "audit entry",
                "verbose_name_plural": "audit",
                "db_table": "delivery_audit",
                "ordering": ("-id",),
                "managed": False,
            },
        ),
    ]
