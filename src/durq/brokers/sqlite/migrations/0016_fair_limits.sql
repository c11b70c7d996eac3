-- durq SQLite schema, version 16: fair limits (W22).
-- A task whose first limit is fair ([key, concurrency, rate, per, template] in `limits`) is
-- stored with its template (fair_template) and a turn (fair_turn): one after its partition's
-- last turn, never before the template's round. The claim takes the template's
-- tasks by turn (durq_tasks_fair), among those of the same priority.
ALTER TABLE durq_tasks ADD COLUMN fair_template TEXT;
ALTER TABLE durq_tasks ADD COLUMN fair_turn INTEGER;

CREATE INDEX durq_tasks_fair ON durq_tasks (queue, fair_template, priority DESC, fair_turn)
    WHERE state = 'pending' AND held_by IS NULL AND fair_template IS NOT NULL;

-- Per queue and fair template: the last turn given to each partition (its resolved key), and
-- the template's round (key ''; limit keys are never empty): the turn of the latest of its
-- tasks a claim started.
CREATE TABLE durq_fair (
    queue    TEXT    NOT NULL,
    template TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    turn     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, template, key)
);

-- The insert gives the turn (insert_task); a stored task's partition keeps it here (a refused
-- insert fires no trigger). Tasks without a fair limit pay the WHEN test alone.
CREATE TRIGGER durq_tasks_fair_turn AFTER INSERT ON durq_tasks
WHEN NEW.fair_template IS NOT NULL
BEGIN
    INSERT INTO durq_fair (queue, template, key, turn)
    VALUES (NEW.queue, NEW.fair_template, json_extract(NEW.limits, '$[0][0]'), NEW.fair_turn)
    ON CONFLICT (queue, template, key) DO UPDATE SET turn = max(turn, excluded.turn);
END;
