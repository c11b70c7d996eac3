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

-- name: insert_orders
-- The orders of concurrent requests in one statement, one round trip in the usual case: the
-- ids returned were inserted; an order not returned has an Idempotency-Key that is taken
-- (committed, or committed by a concurrent request this one waited for), which
-- find_by_keys then reads. Column arrays, one element per order.
INSERT INTO {schema}.orders (id, customer, idempotency_key, request_hash, items, status,
                             task_id, created_at, updated_at)
SELECT id, customer, idempotency_key, request_hash, items::jsonb, 'PENDING', task_id,
       %(now)s, %(now)s
FROM unnest(%(ids)s::text[], %(customers)s::text[], %(keys)s::text[], %(hashes)s::text[],
            %(items)s::text[], %(task_ids)s::text[])
     AS x(id, customer, idempotency_key, request_hash, items, task_id)
ON CONFLICT DO NOTHING
RETURNING id;

-- name: find_by_keys
SELECT o.* FROM {schema}.orders AS o
JOIN unnest(%(customers)s::text[], %(keys)s::text[]) AS x(customer, key)
  ON o.customer = x.customer AND o.idempotency_key = x.key;

-- name: delete_orders
DELETE FROM {schema}.orders WHERE id = ANY(%(ids)s::text[]) AND status = 'PENDING';

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

