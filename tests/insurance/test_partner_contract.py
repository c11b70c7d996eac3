"""The service's partner client is bound to the partner's published OpenAPI document: every
model and operation the client uses must match what the simulator publishes."""

from __future__ import annotations

from typing import Any

import pytest
from examples.insurance import partners

from insurance.kit import Sim

IGNORED = {"title", "description", "default", "examples"}


def normal(schema: Any) -> Any:
    """A schema without documentation-only keys, so only the shape is compared."""
    if isinstance(schema, dict):
        return {k: normal(v) for k, v in schema.items() if k not in IGNORED}
    if isinstance(schema, list):
        return [normal(v) for v in schema]
    return schema


@pytest.fixture
def published(sim: Sim) -> dict[str, Any]:
    return dict(sim.http.get("/openapi.json").json())


@pytest.mark.parametrize("name", sorted(partners.CONTRACT))
def test_client_models_match_the_published_schemas(published: dict[str, Any], name: str) -> None:
    theirs = published["components"]["schemas"][name]
    ours = partners.CONTRACT[name].model_json_schema(ref_template="#/components/schemas/{model}")
    ours.pop("$defs", None)
    assert normal(ours["properties"]) == normal(theirs["properties"])
    assert set(ours.get("required", [])) == set(theirs.get("required", []))


@pytest.mark.parametrize(("method", "path"), sorted(partners.OPERATIONS))
def test_client_operations_exist_with_the_same_bodies(
    published: dict[str, Any], method: str, path: str
) -> None:
    request_model, response_model, status = partners.OPERATIONS[(method, path)]
    operation = published["paths"][path][method]
    answer = operation["responses"][str(status)]["content"]["application/json"]["schema"]
    assert answer["$ref"].rsplit("/", 1)[1] == response_model
    if request_model is not None:
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"].rsplit("/", 1)[1] == request_model


def test_a_drift_is_caught(published: dict[str, Any]) -> None:
    # The check is not vacuous: a client model with a renamed field would not match.
    from pydantic import BaseModel

    class StockLevel(BaseModel):
        warehouse: str
        sku: str
        units: int

    ours = StockLevel.model_json_schema()
    assert normal(ours["properties"]) != normal(
        published["components"]["schemas"]["StockLevel"]["properties"]
    )


def test_the_callback_is_published_with_its_body_and_signature(published: dict[str, Any]) -> None:
    # The decision the service's webhook takes is the one the partner documents it sends.
    (callback,) = published["paths"]["/v1/coverage"]["post"]["callbacks"].values()
    (operation,) = (path["post"] for path in callback.values())
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].rsplit("/", 1)[1] == "CoverageCallback"
    headers = {p["name"].lower() for p in operation["parameters"] if p["in"] == "header"}
    assert headers == {partners.SIGNATURE_HEADER.lower()}
