//! PGMQ on a server that lacks the extension: its schema, types and functions as plain SQL.
//!
//! [PGMQ](https://github.com/pgmq/pgmq) is a message queue made of PostgreSQL tables and
//! functions, usually installed as an extension. When the server has the extension installed
//! (`pg_extension` lists `pgmq`), this module uses it and installs nothing. Otherwise it
//! installs, as ordinary SQL objects, the part of PGMQ's documented API this crate and its
//! benchmarks use, with the same names, argument order and behaviour, so the same statements
//! work against either:
//!
//! | object | what it does |
//! |---|---|
//! | schema `pgmq`, table `pgmq.meta` | one row per queue (`queue_name`, `created_at`, ...) |
//! | `pgmq.q_<queue>` | the queue: `msg_id` (identity), `read_ct`, `enqueued_at`, `vt`, `message jsonb` |
//! | `pgmq.a_<queue>` | its archive: the same columns plus `archived_at` |
//! | `pgmq.create(queue_name)` | creates both tables and their indexes; again is a no-op |
//! | `pgmq.drop_queue(queue_name)` | drops them; `false` if there was no such queue |
//! | `pgmq.send(queue_name, msg, delay = 0)` | stores a message, visible after `delay` seconds; its id |
//! | `pgmq.send_batch(queue_name, msgs[], delay = 0)` | the same for many; their ids |
//! | `pgmq.read(queue_name, vt, qty, conditional = '{}')` | up to `qty` visible messages whose body contains `conditional`, oldest first, hidden for `vt` seconds, `read_ct` + 1 |
//! | `pgmq.set_vt(queue_name, msg_id, vt)` | hides a message for `vt` seconds from now |
//! | `pgmq.archive(queue_name, msg_id \| msg_ids[])` | moves messages to the archive |
//! | `pgmq.delete(queue_name, msg_id \| msg_ids[])` | deletes messages |
//! | `pgmq.metrics(queue_name)` | queue length, message ages, messages ever sent |
//!
//! The SQL is written for this crate from PGMQ's documented behaviour; it is not PGMQ's
//! source. The installation runs in one transaction under the advisory lock the crate's
//! table creation takes, and marks the schema with a version comment: a second installation
//! finds the mark and does nothing, and two processes installing at once take turns.
//! Queues are created with `pgmq.create` under the same lock (PGMQ's own `create` is not safe
//! when two sessions create one queue at once).

use sea_orm::{ConnectionTrait, DbErr, TransactionTrait};

use crate::infra::postgres::schema::SCHEMA_LOCK;
use crate::infra::postgres::{Identifier, PgDatabase};

/// The comment on schema `pgmq` that marks this crate's installation, and its version.
const MARK: &str = "prometheus_parking_lot pgmq-compatible SQL, version 1";

/// Where the PGMQ objects a queue uses come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgmqSource {
    /// The server has the `pgmq` extension: nothing was installed.
    Extension,
    /// This call installed the plain SQL objects.
    Installed,
    /// The plain SQL objects were installed already (by an earlier call or another process).
    AlreadyInstalled,
}

/// The plain SQL objects, installed when the extension is absent.
const INSTALL: &str = r#"
CREATE SCHEMA IF NOT EXISTS pgmq;

CREATE TABLE IF NOT EXISTS pgmq.meta (
    queue_name     VARCHAR     NOT NULL UNIQUE,
    is_partitioned BOOLEAN     NOT NULL DEFAULT false,
    is_unlogged    BOOLEAN     NOT NULL DEFAULT false,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

DO $install$ BEGIN
    CREATE TYPE pgmq.message_record AS (
        msg_id BIGINT, read_ct INTEGER, enqueued_at TIMESTAMPTZ, vt TIMESTAMPTZ, message JSONB);
EXCEPTION WHEN duplicate_object THEN NULL;
END $install$;

DO $install$ BEGIN
    CREATE TYPE pgmq.metrics_result AS (
        queue_name TEXT, queue_length BIGINT, newest_msg_age_sec INTEGER,
        oldest_msg_age_sec INTEGER, total_messages BIGINT, scrape_time TIMESTAMPTZ);
EXCEPTION WHEN duplicate_object THEN NULL;
END $install$;

-- A queue name becomes part of table and index names: letters, digits and '_', under 48.
CREATE OR REPLACE FUNCTION pgmq.validate_queue_name(queue_name TEXT) RETURNS VOID
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
    IF $1 IS NULL OR $1 !~ '^[A-Za-z_][A-Za-z0-9_]*$' OR length($1) >= 48 THEN
        RAISE EXCEPTION 'queue name %: use a letter or _ followed by letters, digits or _, at most 47 characters', $1;
    END IF;
END $fn$;

CREATE OR REPLACE FUNCTION pgmq.create(queue_name TEXT) RETURNS VOID
LANGUAGE plpgsql AS $fn$
DECLARE
    qname TEXT := lower($1);
BEGIN
    PERFORM pgmq.validate_queue_name(qname);
    EXECUTE format(
        'CREATE TABLE IF NOT EXISTS pgmq.%I (
             msg_id      BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
             read_ct     INTEGER     NOT NULL DEFAULT 0,
             enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
             vt          TIMESTAMPTZ NOT NULL,
             message     JSONB)', 'q_' || qname);
    EXECUTE format(
        'CREATE TABLE IF NOT EXISTS pgmq.%I (
             msg_id      BIGINT PRIMARY KEY,
             read_ct     INTEGER     NOT NULL DEFAULT 0,
             enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
             archived_at TIMESTAMPTZ NOT NULL DEFAULT now(),
             vt          TIMESTAMPTZ NOT NULL,
             message     JSONB)', 'a_' || qname);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON pgmq.%I (vt)',
                   'q_' || qname || '_vt_idx', 'q_' || qname);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON pgmq.%I (archived_at)',
                   'archived_at_idx_' || qname, 'a_' || qname);
    INSERT INTO pgmq.meta (queue_name) VALUES (qname) ON CONFLICT DO NOTHING;
END $fn$;

CREATE OR REPLACE FUNCTION pgmq.drop_queue(queue_name TEXT) RETURNS BOOLEAN
LANGUAGE plpgsql AS $fn$
DECLARE
    qname TEXT := lower($1);
BEGIN
    PERFORM pgmq.validate_queue_name(qname);
    IF to_regclass(format('pgmq.%I', 'q_' || qname)) IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE IF EXISTS pgmq.%I', 'q_' || qname);
    EXECUTE format('DROP TABLE IF EXISTS pgmq.%I', 'a_' || qname);
    DELETE FROM pgmq.meta WHERE meta.queue_name = qname;
    RETURN true;
END $fn$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay INTEGER DEFAULT 0)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY EXECUTE format(
        'INSERT INTO pgmq.%I (vt, message)
         VALUES (clock_timestamp() + make_interval(secs => $2), $1) RETURNING msg_id',
        'q_' || lower($1)) USING $2, $3;
END $fn$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay INTEGER DEFAULT 0)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY EXECUTE format(
        'INSERT INTO pgmq.%I (vt, message)
         SELECT clock_timestamp() + make_interval(secs => $2), body
           FROM unnest($1) WITH ORDINALITY AS sent(body, position) ORDER BY position
         RETURNING msg_id',
        'q_' || lower($1)) USING $2, $3;
END $fn$;

CREATE OR REPLACE FUNCTION pgmq.read(
    queue_name TEXT, vt INTEGER, qty INTEGER, conditional JSONB DEFAULT '{}')
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY EXECUTE format(
        'WITH picked AS (
             SELECT msg_id FROM pgmq.%1$I
              WHERE vt <= clock_timestamp() AND message @> $2
              ORDER BY msg_id LIMIT $1 FOR UPDATE SKIP LOCKED)
         UPDATE pgmq.%1$I AS q
            SET vt = clock_timestamp() + make_interval(secs => $3), read_ct = q.read_ct + 1
           FROM picked WHERE q.msg_id = picked.msg_id
         RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.vt, q.message',
        'q_' || lower($1)) USING $3, coalesce($4, '{}'::jsonb), $2;
END $fn$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_id BIGINT, vt INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY EXECUTE format(
        'UPDATE pgmq.%I SET vt = clock_timestamp() + make_interval(secs => $2)
          WHERE msg_id = $1
         RETURNING msg_id, read_ct, enqueued_at, vt, message',
        'q_' || lower($1)) USING $2, $3;
END $fn$;

CREATE OR REPLACE FUNCTION pgmq.archive(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY EXECUTE format(
        'WITH gone AS (DELETE FROM pgmq.%I WHERE msg_id = ANY($1)
                        RETURNING msg_id, read_ct, enqueued_at, vt, message)
         INSERT INTO pgmq.%I (msg_id, read_ct, enqueued_at, vt, message)
         SELECT msg_id, read_ct, enqueued_at, vt, message FROM gone RETURNING msg_id',
        'q_' || lower($1), 'a_' || lower($1)) USING $2;
END $fn$;

CREATE OR REPLACE FUNCTION pgmq.archive(queue_name TEXT, msg_id BIGINT)
RETURNS BOOLEAN LANGUAGE sql AS $fn$
    SELECT EXISTS (SELECT 1 FROM pgmq.archive($1, ARRAY[$2]));
$fn$;

CREATE OR REPLACE FUNCTION pgmq.delete(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY EXECUTE format(
        'DELETE FROM pgmq.%I WHERE msg_id = ANY($1) RETURNING msg_id',
        'q_' || lower($1)) USING $2;
END $fn$;

CREATE OR REPLACE FUNCTION pgmq.delete(queue_name TEXT, msg_id BIGINT)
RETURNS BOOLEAN LANGUAGE sql AS $fn$
    SELECT EXISTS (SELECT 1 FROM pgmq.delete($1, ARRAY[$2]));
$fn$;

CREATE OR REPLACE FUNCTION pgmq.metrics(queue_name TEXT)
RETURNS pgmq.metrics_result LANGUAGE plpgsql AS $fn$
DECLARE
    result pgmq.metrics_result;
BEGIN
    EXECUTE format(
        'SELECT $1, count(*),
                extract(epoch FROM now() - max(enqueued_at))::integer,
                extract(epoch FROM now() - min(enqueued_at))::integer,
                (SELECT coalesce(max(m), 0) FROM (
                    SELECT max(msg_id) AS m FROM pgmq.%1$I
                    UNION ALL SELECT max(msg_id) FROM pgmq.%2$I) AS ids),
                now()
           FROM pgmq.%1$I', 'q_' || lower($1), 'a_' || lower($1))
      INTO result USING $1;
    RETURN result;
END $fn$;
"#;

impl PgDatabase {
    /// Makes PGMQ's API available: the extension when the server has it installed, else the
    /// plain SQL objects (see the module docs). Safe from any number of processes at once, and
    /// again.
    pub async fn install_pgmq(&self) -> Result<PgmqSource, DbErr> {
        self.run(move |connection| async move {
            let transaction = connection.begin().await?;
            transaction
                .execute_unprepared(&format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"))
                .await?;
            let source = match installed(&transaction).await? {
                Some(source) => source,
                None => {
                    transaction.execute_unprepared(INSTALL).await?;
                    transaction
                        .execute_unprepared(&format!("COMMENT ON SCHEMA pgmq IS '{MARK}'"))
                        .await?;
                    PgmqSource::Installed
                }
            };
            transaction.commit().await?;
            Ok(source)
        })
        .await
    }

    /// Creates the PGMQ queues `names` (with `pgmq.create`) and runs `extra` (indexes of the
    /// caller's own, say), under the schema lock, so processes creating one queue at once take
    /// turns. PGMQ must be available ([`install_pgmq`](Self::install_pgmq)).
    pub(crate) async fn create_pgmq_queues(
        &self,
        names: Vec<Identifier>,
        extra: String,
    ) -> Result<(), DbErr> {
        self.run(move |connection| async move {
            let transaction = connection.begin().await?;
            transaction
                .execute_unprepared(&format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"))
                .await?;
            for name in names {
                let create = "SELECT pgmq.create($1)";
                let name = sea_orm::Value::from(name.as_str().to_owned());
                transaction
                    .execute_raw(PgDatabase::statement(create, [name]))
                    .await?;
            }
            transaction.execute_unprepared(&extra).await?;
            transaction.commit().await
        })
        .await
    }
}

/// What provides PGMQ already, if anything: the extension, or this crate's objects of the
/// current version.
async fn installed(
    transaction: &sea_orm::DatabaseTransaction,
) -> Result<Option<PgmqSource>, DbErr> {
    let found = transaction
        .query_one_raw(PgDatabase::statement(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pgmq') AS extension, \
                    coalesce((SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace \
                               WHERE nspname = 'pgmq'), '') AS mark",
            Vec::<sea_orm::Value>::new(),
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("checking for pgmq returned no row".into()))?;
    let extension: bool = found.try_get("", "extension")?;
    let mark: String = found.try_get("", "mark")?;
    Ok(if extension {
        Some(PgmqSource::Extension)
    } else if mark == MARK {
        Some(PgmqSource::AlreadyInstalled)
    } else {
        None
    })
}
