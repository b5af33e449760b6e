"""Statements PostgreSQL plans once per connection (PREPARE, then EXECUTE), where Django has
each of its statements planned at every execution (it binds their parameters on the client): for
what runs on every sale (its endpoint's row: controlplane.selling.check_sale). Not psycopg's
prepared statements: psycopg deallocates them all at any rollback (a refused sale's, a
savepoint's), and PostgreSQL keeps a prepared statement through one. Off with
DATABASE_PREPARED_STATEMENTS=0 (settings)."""

import functools
import hashlib
import re
import weakref
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection


class Prepared(NamedTuple):
    """A statement (`sql`, its %(name)s parameters numbered for PREPARE) and its EXECUTE."""

    sql: str
    name: str
    prepare: str
    execute: str

    @classmethod
    @functools.cache
    def of(cls, sql: str) -> "Prepared":
        """From `sql` with %(name)s parameters (and no other %), named after its text."""
        if "%%" in sql or re.search(r"%s", sql):
            raise ValueError("a prepared statement takes %(name)s parameters only")
        params = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
        name = "controlplane_" + hashlib.sha256(sql.encode()).hexdigest()[:16]
        numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${params.index(m.group(1)) + 1}", sql)
        arguments = ", ".join(f"%({p})s" for p in params)
        return cls(sql, name, f"PREPARE {name} AS {numbered}", f"EXECUTE {name}({arguments})")

    def ready(self) -> str:
        """Prepare it where the connection has not yet (a statement of its own, once per
        connection, outside any pipeline: only a PREPARE that ran counts); its EXECUTE. The
        statement itself where they are off."""
        if not settings.DATABASE_PREPARED_STATEMENTS:
            return self.sql
        raw = connection.connection
        if self.name not in _PREPARED.get(raw, ()):
            with connection.cursor() as cursor:
                cursor.execute(self.prepare)
            _PREPARED.setdefault(raw, set()).add(self.name)
        return self.execute


# The statements each connection has prepared (Prepared), while it lives.
_PREPARED: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
