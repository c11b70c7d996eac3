-- durq PostgreSQL schema, version 3: payload_json, a task's payload as jsonb (NULL when it
-- is not JSON), so the inspector's search by payload field never fails on one odd row.
CREATE FUNCTION {schema}.payload_json(raw bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(raw, 'UTF8')::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END;
$$;
