"""Keys made before keys had scopes keep what they could do: a staff user's key was granted
`operator.admin` when its client asked, so it gets the `admin` scope (0007 gave every key the
default read, write and approvals). Keys of other users have what they could use already."""

from typing import Any

from django.db import migrations

ORDER = ("read", "write", "approvals", "admin")


def staff_keys_keep_admin(apps: Any, schema_editor: Any) -> None:
    ApiToken = apps.get_model("sessions_app", "ApiToken")
    changed = []
    for token in ApiToken.objects.filter(user__is_staff=True).only("pk", "scopes").iterator():
        scopes = set(token.scopes or []) | {"admin"}
        if set(token.scopes or []) != scopes:
            token.scopes = [scope for scope in ORDER if scope in scopes]
            changed.append(token)
    ApiToken.objects.bulk_update(changed, ["scopes"], batch_size=500)


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0007_http_api"),
    ]

    operations = [
        # backwards: nothing to undo that 0007's own reverse does not drop with the column
        migrations.RunPython(staff_keys_keep_admin, migrations.RunPython.noop),
    ]
