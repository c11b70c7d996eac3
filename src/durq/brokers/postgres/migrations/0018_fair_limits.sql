-- durq PostgreSQL schema, version 18: fair limits (W22).
-- A task whose first limit is fair ([key, concurrency, rate, per, template] in `limits`) gets
-- its template (fair_template), partition (fair_key) and a turn (fair_turn) when it is
-- stored: one after its partition's last turn, never before the template's round. The claim
-- takes the template's tasks by turn (tasks_fair), among those of the same priority.
ALTER TABLE {schema}.tasks ADD COLUMN fair_template text;
ALTER TABLE {schema}.tasks ADD COLUMN fair_key text;
ALTER TABLE {schema}.tasks ADD COLUMN fair_turn bigint;

CREATE INDEX tasks_fair ON {schema}.tasks (queue, fair_template, priority DESC, fair_turn, seq)
    WHERE state = 'pending' AND held_by IS NULL AND fair_template IS NOT NULL;
-- The last turn of a partition among the rows of one statement (a batch's earlier rows).
CREATE INDEX tasks_fair_turns ON {schema}.tasks (queue, fair_template, fair_key, fair_turn)
    WHERE fair_template IS NOT NULL;

-- Per queue and fair template: the last turn given to each partition (its resolved key), and
-- the template's round (key ''; limit keys are never empty): the turn of the latest of its
-- tasks a claim started.
CREATE TABLE {schema}.fair (
    queue    text   NOT NULL,
    template text   NOT NULL,
    key      text   NOT NULL,
    turn     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, template, key)
);
-- The templates of a queue, for the claim (fair_due).
CREATE INDEX fair_rounds ON {schema}.fair (queue) WHERE key = '';

-- Before the row is written: its turn, from the stored turns and the rows an earlier part
-- of the same statement wrote (their partition's turn is stored after the statement).
CREATE FUNCTION {schema}.fair_turn() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.fair_template := NEW.limits -> 0 ->> 4;
    NEW.fair_key := NEW.limits -> 0 ->> 0;
    NEW.fair_turn := greatest(
        (SELECT f.turn FROM {schema}.fair AS f
         WHERE f.queue = NEW.queue AND f.template = NEW.fair_template AND f.key = NEW.fair_key),
        (SELECT f.turn FROM {schema}.fair AS f
         WHERE f.queue = NEW.queue AND f.template = NEW.fair_template AND f.key = ''),
        (SELECT max(t.fair_turn) FROM {schema}.tasks AS t
         WHERE t.queue = NEW.queue AND t.fair_template = NEW.fair_template
           AND t.fair_key = NEW.fair_key),
        0) + 1;
    RETURN NEW;
END;
$$;

-- After the row is stored (a refused insert fires no AFTER trigger): the partition's turn.
CREATE FUNCTION {schema}.fair_taken() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.fair AS f (queue, template, key, turn)
    VALUES (NEW.queue, NEW.fair_template, NEW.fair_key, NEW.fair_turn)
    ON CONFLICT (queue, template, key) DO UPDATE SET turn = greatest(f.turn, excluded.turn);
    -- The template's round row, for the claim to find it (no lock once it exists).
    INSERT INTO {schema}.fair (queue, template, key) VALUES (NEW.queue, NEW.fair_template, '')
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;

-- Tasks without a fair limit pay the WHEN test alone.
CREATE TRIGGER tasks_fair_turn BEFORE INSERT ON {schema}.tasks
FOR EACH ROW WHEN (NEW.limits IS NOT NULL AND (NEW.limits -> 0 ->> 4) IS NOT NULL)
EXECUTE FUNCTION {schema}.fair_turn();
CREATE TRIGGER tasks_fair_taken AFTER INSERT ON {schema}.tasks
FOR EACH ROW WHEN (NEW.fair_template IS NOT NULL)
EXECUTE FUNCTION {schema}.fair_taken();
