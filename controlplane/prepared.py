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
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from django.conf import settings
from django.db import DatabaseError, connection

T = TypeVar("T")


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
                # One the session holds unrecorded (prepared before its record was forgotten)
                # is replaced: a PREPARE of a name taken fails.
                cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE name = %s", [self.name])
                if cursor.fetchone()[0]:
                    cursor.execute(f"DEALLOCATE {self.name}")
                cursor.execute(self.prepare)
            _PREPARED.setdefault(raw, set()).add(self.name)
        return self.execute

    def retried(self, run: Callable[[], T]) -> T:
        """`run()`, an atomic block that executes this statement, run once more with it prepared
        anew when the connection's was gone (a DEALLOCATE ALL, a DISCARD ALL) or planned for
        columns since changed (a migration that changed the type of one it returns: "cached
        plan must not change result type"); `run`'s block rolled back, the caller's
        transaction goes on. Without it every use on that connection would fail for as long
        as the connection lives."""
        try:
            return run()
        except DatabaseError as error:
            # 26000: no such prepared statement; 0A000: "cached plan must not change result
            # type" (by code: the message is in the server's language). Another error of
            # either kind fails again, and is raised then.
            if getattr(error.__cause__, "sqlstate", None) not in ("26000", "0A000"):
                raise
        _PREPARED.get(connection.connection, set()).discard(self.name)
        return run()


# The statements each connection has prepared (Prepared), while it lives.
_PREPARED: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
