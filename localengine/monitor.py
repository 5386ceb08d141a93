"""The resource monitor the program talks to: each RegisterResource becomes a step of the
Deployment, whose answer (URN, ID, outputs) goes back to the program. It stands where the
Pulumi CLI's monitor stands; the Python SDK calls it in-process (its mock-monitor hook),
from worker threads, so independent steps run in parallel as the engine runs them."""

from __future__ import annotations

from typing import Any

from google.protobuf import empty_pb2, json_format
from pulumi.runtime.mocks import MockCallArgs, MockMonitor, MockResourceArgs, Mocks
from pulumi.runtime.proto import resource_pb2

from localengine import wire
from localengine.deployment import STACK_TYPE, Deployment, EngineError


class _Refuse(Mocks):
    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        raise EngineError(f"{args.name}: reading existing resources ({args.typ}) is not modelled")

    def call(self, args: MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        raise EngineError(f"the local engine does not model the invoke {args.token}")


# Options the engine would honour but this program never sets: refused, not ignored.
_UNMODELLED = ("protect", "retainOnDelete", "deletedWith", "replace_with", "importId", "remote")


class EngineMonitor(MockMonitor):
    def __init__(self, deployment: Deployment):
        super().__init__(_Refuse())
        self.deployment = deployment

    def RegisterResource(self, request: Any) -> Any:
        dep = self.deployment
        if request.type == STACK_TYPE:
            urn = dep.register_component(request.type, request.name, "", [])
            return resource_pb2.RegisterResourceResponse(urn=urn)
        for option in _UNMODELLED:
            if getattr(request, option, None):
                raise EngineError(f"{request.name}: resource option {option} is not modelled")
        if request.HasField("replacement_trigger"):
            raise EngineError(f"{request.name}: resource option replacementTrigger is not modelled")
        aliases = self._aliases(request)
        if not request.custom:
            urn = dep.register_component(request.type, request.name, request.parent, aliases)
            return resource_pb2.RegisterResourceResponse(urn=urn)
        timeouts = json_format.MessageToDict(request.customTimeouts)
        urn, id_, outputs = dep.register_custom(
            typ=request.type,
            name=request.name,
            parent=request.parent,
            inputs=wire.from_struct(request.object),
            provider_ref=request.provider,
            version=request.version,
            dependencies=list(request.dependencies),
            property_dependencies={
                k: list(v.urns) for k, v in request.propertyDependencies.items()
            },
            delete_before_replace=bool(request.deleteBeforeReplace)
            if request.deleteBeforeReplaceDefined
            else None,
            ignore_changes=list(request.ignoreChanges),
            replace_on_changes=list(request.replaceOnChanges),
            additional_secret_outputs=list(request.additionalSecretOutputs),
            aliases=aliases,
            custom_timeouts={k: str(v) for k, v in timeouts.items()},
        )
        return resource_pb2.RegisterResourceResponse(
            urn=urn, id=id_ if id_ != wire.UNKNOWN else "", object=wire.to_struct(outputs)
        )

    def _aliases(self, request: Any) -> list[str]:
        urns = [a.urn for a in request.aliases if a.urn]
        specs = [
            {
                "name": a.spec.name,
                "type": a.spec.type,
                "stack": a.spec.stack,
                "parentUrn": a.spec.parentUrn,
                "noParent": a.spec.noParent,
            }
            for a in request.aliases
            if not a.urn
        ]
        return urns + self.deployment.alias_urns(request.parent, request.type, request.name, specs)

    def RegisterResourceOutputs(self, request: Any) -> Any:
        self.deployment.component_outputs(request.urn, wire.from_struct(request.outputs))
        return empty_pb2.Empty()

    def ReadResource(self, request: Any) -> Any:
        raise EngineError(f"{request.name}: reading existing resources is not modelled")
