-- Orders of the insurance service (PostgreSQL dialect). Named blocks, loaded once by
-- store.py; {schema} is filled with a quoted identifier, values are always parameters.

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.orders (
    id              TEXT PRIMARY KEY,
    customer        TEXT NOT NULL,
    idempotency_key TEXT,
    request_hash    TEXT NOT NULL,
    items           JSONB NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('PENDING', 'COVERED', 'FAILED')),
    task_id         TEXT NOT NULL,
    external_ref    TEXT,
    policy_number   TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    created_at      DOUBLE PRECISION NOT NULL,
    updated_at      DOUBLE PRECISION NOT NULL,
    UNIQUE (customer, idempotency_key)
);

-- name: insert_order
-- One round trip for the usual case: a row back means inserted; none means an order with
-- this Idempotency-Key exists (committed, or committed by a concurrent request this one
-- waited for), which find_by_key then reads.
INSERT INTO {schema}.orders (id, customer, idempotency_key, request_hash, items, status,
                             task_id, created_at, updated_at)
VALUES (%(id)s, %(customer)s, %(idempotency_key)s, %(request_hash)s, %(items)s::jsonb,
        'PENDING', %(task_id)s, %(now)s, %(now)s)
ON CONFLICT DO NOTHING
RETURNING id;

-- name: find_by_key
SELECT * FROM {schema}.orders
WHERE customer = %(customer)s AND idempotency_key = %(idempotency_key)s;

-- name: get_for_customer
SELECT * FROM {schema}.orders WHERE id = %(id)s AND customer = %(customer)s;

-- name: get
SELECT * FROM {schema}.orders WHERE id = %(id)s;

-- name: set_external_ref
UPDATE {schema}.orders SET external_ref = %(external_ref)s, updated_at = %(now)s
WHERE id = %(id)s AND status = 'PENDING';

-- name: record_attempt
UPDATE {schema}.orders SET attempts = %(attempts)s, last_error = %(last_error)s,
                           updated_at = %(now)s
WHERE id = %(id)s AND status = 'PENDING';

-- name: mark_covered
UPDATE {schema}.orders SET status = 'COVERED', policy_number = %(policy_number)s,
                           attempts = %(attempts)s, last_error = NULL, updated_at = %(now)s
WHERE id = %(id)s AND status = 'PENDING';

-- name: mark_failed
UPDATE {schema}.orders SET status = 'FAILED', attempts = %(attempts)s,
                           last_error = %(last_error)s, updated_at = %(now)s
WHERE id = %(id)s AND status = 'PENDING';

-- name: count_orders
SELECT count(*) FROM {schema}.orders;

-- name: delete_order
DELETE FROM {schema}.orders WHERE id = %(id)s AND status = 'PENDING';
