"""Many rows into one table at once, for measurements that arrive by the thousand a second (telemetry).

On PostgreSQL the rows go in with COPY (psycopg's `Cursor.copy`): no SQL text of the size of the batch to
build and parse, and no model instances; elsewhere (the embedded SQLite default) through `bulk_create`.
Both skip model validation, signals and the change log, which is right for samples and only for them.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from django.db import connection, models


def model_rows_insert(*, model: type[models.Model], fields: Sequence[str], rows: Iterable[Sequence]) -> int:
    """Insert `rows` (tuples of values in the order of `fields`, foreign keys as their `<name>_id`, JSON
    fields as Python values) into `model`'s table inside the caller's transaction. Returns the number of rows."""
    rows = list(rows)
    if not rows:
        return 0
    if connection.vendor == "postgresql":
        from psycopg.types.json import Jsonb

        quote = connection.ops.quote_name
        columns = ", ".join(quote(model._meta.get_field(name).column) for name in fields)
        # JSON columns take their values as JSON (psycopg would send a Python list as an array); null stays SQL NULL.
        json_at = [i for i, name in enumerate(fields) if isinstance(model._meta.get_field(name), models.JSONField)]
        with connection.cursor() as cursor:
            # Django's cursor wraps psycopg's; COPY is psycopg's own API.
            with cursor.cursor.copy(f"COPY {quote(model._meta.db_table)} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    if json_at:
                        row = list(row)
                        for i in json_at:
                            if row[i] is not None:
                                row[i] = Jsonb(row[i])
                    copy.write_row(row)
        return len(rows)
    model.objects.bulk_create([model(**dict(zip(fields, row))) for row in rows], batch_size=500)
    return len(rows)
