-- Orders of the insurance service (SQLite dialect). Named blocks, loaded once by store.py.

-- name: create_schema
CREATE TABLE IF NOT EXISTS orders (
    id              TEXT PRIMARY KEY,
    customer        TEXT NOT NULL,
    idempotency_key TEXT,
    request_hash    TEXT NOT NULL,
    items           TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('PENDING', 'COVERED', 'FAILED')),
    task_id         TEXT NOT NULL,
    external_ref    TEXT,
    policy_number   TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    UNIQUE (customer, idempotency_key)
);

-- name: insert_order
INSERT INTO orders (id, customer, idempotency_key, request_hash, items, status, task_id,
                    created_at, updated_at)
VALUES (:id, :customer, :idempotency_key, :request_hash, :items, 'PENDING', :task_id, :now, :now);

-- name: find_by_key
SELECT * FROM orders WHERE customer = :customer AND idempotency_key = :idempotency_key;

-- name: get_for_customer
SELECT * FROM orders WHERE id = :id AND customer = :customer;

-- name: get
SELECT * FROM orders WHERE id = :id;

-- name: set_external_ref
UPDATE orders SET external_ref = :external_ref, updated_at = :now
WHERE id = :id AND status = 'PENDING';

-- name: record_attempt
UPDATE orders SET attempts = :attempts, last_error = :last_error, updated_at = :now
WHERE id = :id AND status = 'PENDING';

-- name: mark_covered
UPDATE orders SET status = 'COVERED', policy_number = :policy_number, attempts = :attempts,
                  last_error = NULL, updated_at = :now
WHERE id = :id AND status = 'PENDING';

-- name: mark_failed
UPDATE orders SET status = 'FAILED', attempts = :attempts, last_error = :last_error,
                  updated_at = :now
WHERE id = :id AND status = 'PENDING';

-- name: count_orders
SELECT count(*) FROM orders;

-- name: delete_order
DELETE FROM orders WHERE id = :id AND status = 'PENDING';
