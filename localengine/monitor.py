"""The engine's two gRPC services the program talks to, as the Pulumi CLI serves them
(pulumi/pulumi v3.259.0 `pkg/resource/deploy/source_eval.go` resmon, `pkg/engine/...`
engine server; the protocol is `proto/pulumi/resource.proto` and `engine.proto`):

- ResourceMonitor: each RegisterResource becomes a step of the Deployment, whose answer
  (URN, ID, outputs) goes back to the program; RegisterResourceOutputs records a
  component's (and the stack's) outputs; GetDeploymentInfo says which features the
  monitor supports. Every call comes from the program's own process (langhost.py), on a
  thread of this server, so independent steps run in parallel as the engine runs them.
- Engine: Log (the program's diagnostics, e.g. the language host's "Program failed ..."),
  GetRootResource / SetRootResource (the stack resource's URN).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import empty_pb2, json_format
from pulumi.runtime.proto import (
    engine_pb2,
    engine_pb2_grpc,
    resource_pb2,
    resource_pb2_grpc,
)

from localengine import wire
from localengine.executor import STACK_TYPE, Deployment, EngineError

# Options the engine would honour but this program never sets: refused, not ignored.
_UNMODELLED = ("protect", "retainOnDelete", "deletedWith", "replace_with", "importId", "remote")

# What the monitor says it supports (GetDeploymentInfo). The SDK refuses, in the program,
# an option whose feature is missing (transforms, hooks, parameterized packages); the
# options below are accepted by the SDK and refused here by name when a program sets them.
FEATURES = (
    resource_pb2.RESOURCE_MONITOR_FEATURE_SECRETS,
    resource_pb2.RESOURCE_MONITOR_FEATURE_RESOURCE_REFERENCES,
    resource_pb2.RESOURCE_MONITOR_FEATURE_ALIAS_SPECS,
    resource_pb2.RESOURCE_MONITOR_FEATURE_DELETED_WITH,
    resource_pb2.RESOURCE_MONITOR_FEATURE_REPLACEMENT_TRIGGER,
    resource_pb2.RESOURCE_MONITOR_FEATURE_REPLACE_WITH,
)
_LEGACY = {"secrets", "resourceReferences", "aliasSpecs", "deletedWith"}


# source_eval.go (v3.259.0) RegisterResource / RegisterResourceOutputs: once the step
# executor cancels the deployment (step_executor.go cancelDueToError: a step failed), every
# call waiting on a step or arriving after is answered Unavailable. The SDK then ends the
# program quietly (settings.py grpc_error_to_exception: RunError "Resource monitor has
# terminated"), and the CLI shows the step's error, once.
SHUT_DOWN = "resource monitor shut down while waiting on step's done channel"


def _refuse(context: Any, fn: Callable[[], Any], deployment: Deployment | None) -> Any:
    """An engine error goes back to the program as the call's status, in one line:
    Unavailable once the deployment was cancelled by a failed step, else Unknown (the
    request itself is wrong: the program's own error)."""
    if deployment is not None and deployment.failed():
        context.abort(grpc.StatusCode.UNAVAILABLE, SHUT_DOWN)
    try:
        return fn()
    except (EngineError, wire.UnsupportedValue) as e:
        if deployment is not None and deployment.failed():
            context.abort(grpc.StatusCode.UNAVAILABLE, SHUT_DOWN)
        context.abort(grpc.StatusCode.UNKNOWN, str(e))


class EngineMonitor(resource_pb2_grpc.ResourceMonitorServicer):
    """`deployment` is set once the run's Deployment exists (it needs the services'
    address for its provider hosts)."""

    deployment: Deployment

    def GetDeploymentInfo(self, request: Any, context: Any) -> Any:
        return resource_pb2.DeploymentInfo(supportedFeatures=list(FEATURES))

    def SupportsFeature(self, request: Any, context: Any) -> Any:
        return resource_pb2.SupportsFeatureResponse(hasSupport=request.id in _LEGACY)

    def Invoke(self, request: Any, context: Any) -> Any:
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"the local engine does not model the invoke {request.tok}",
        )

    def ReadResource(self, request: Any, context: Any) -> Any:
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"{request.name}: reading existing resources ({request.type}) is not modelled",
        )

    def RegisterResource(self, request: Any, context: Any) -> Any:
        return _refuse(context, lambda: self._register(request), getattr(self, "deployment", None))

    def _register(self, request: Any) -> Any:
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

    def SignalAndWaitForShutdown(self, request: Any, context: Any) -> Any:
        """The program is done registering. Nothing to wait for: each RegisterResource
        answered when its step was done."""
        return empty_pb2.Empty()

    def RegisterResourceOutputs(self, request: Any, context: Any) -> Any:
        return _refuse(context, lambda: self._outputs(request), getattr(self, "deployment", None))

    def _outputs(self, request: Any) -> Any:
        self.deployment.component_outputs(request.urn, wire.from_struct(request.outputs))
        return empty_pb2.Empty()


class EngineService(engine_pb2_grpc.EngineServicer):
    """Log lines of the program go to `log`; its errors to `errors` (the run's first one
    is reported as its error, once, when the run ends). Once `cancelled()` (a step failed:
    the CLI's engine has ended the deployment and no longer shows the program), its lines
    are dropped."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.cancelled: Callable[[], bool] = lambda: False
        self.errors: list[str] = []
        self._root = ""
        self._lock = threading.Lock()

    def Log(self, request: Any, context: Any) -> Any:
        message = request.message.rstrip("\n")
        if self.cancelled():
            return empty_pb2.Empty()
        if request.severity == engine_pb2.ERROR:
            with self._lock:  # shown once, as the run's error, when the run ends
                self.errors.append(message)
        elif request.severity in (engine_pb2.WARNING, engine_pb2.INFO):
            prefix = "warning: " if request.severity == engine_pb2.WARNING else ""
            self.log(f"{prefix}{message}")
        return empty_pb2.Empty()

    def GetRootResource(self, request: Any, context: Any) -> Any:
        with self._lock:
            return engine_pb2.GetRootResourceResponse(urn=self._root)

    def SetRootResource(self, request: Any, context: Any) -> Any:
        with self._lock:
            self._root = request.urn
        return engine_pb2.SetRootResourceResponse()
