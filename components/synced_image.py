"""SyncedImage: one image that implements the model, the same on every node.

Obtained once on the head; checked there to implement the model's architectures BEFORE
anything else happens (so a wrong image is never streamed or started); streamed
node-to-node over the cluster link (to several workers that lack it, whole or an update's
new layers, relayed hop by hop so that it leaves the head once); each node's copy compared
by fingerprint and by its Python/Ray/vLLM/torch versions. The obtain and stream steps are
NodeSteps: a refresh reads each node's fingerprint back, so an image removed or replaced
under the same tag on a node re-runs that node's stream on the next `up`. Containers run
the image by its reference (`ref`) and wait for `ready_on(node)`, which resolves only when
every check passed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import pulumi

from components.adapters import gated, remote_command
from components.gb10_node import GB10Node
from components.node_step import NodeStep, carried
from sparkvllm.specs import versions
from sparkvllm.specs.output import key_values, last_json, same_on_every_node
from sparkvllm.specs.plans import ImagePlan


@dataclass(frozen=True)
class SyncedImageArgs:
    plan: ImagePlan
    nodes: Mapping[str, GB10Node]
    # Resolves once the cluster link was measured (ClusterLinks.measured): no transfer
    # may share the link with a measurement.
    link_measured: pulumi.Output[Any] | None = None


class SyncedImage(pulumi.ComponentResource):
    """Outputs: `support` (vLLM version, the model's architectures, where each is
    implemented), `image_ids` (node -> image ID on that node), `fingerprint`
    (storage-independent identity, equal on every node), `versions` (the
    Python/Ray/vLLM/torch versions every node agrees on), `transferred` (node -> whether
    the relay or its stream step moved the image there when they last ran).
    `model_checked` resolves once the image is known to implement the model."""

    model_checked: pulumi.Output[pulumi.Resource]
    support: pulumi.Output[dict[str, Any]]

    def __init__(
        self, name: str, args: SyncedImageArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(ImagePlan.TYPE, name, None, opts)
        plan = args.plan
        head = args.nodes[plan.head]
        obtain = NodeStep(
            plan.obtain,
            reach=head.reach,
            triggers=list(plan.obtain_triggers),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[head.checked]),
        )
        self.obtained = obtain
        self.steps: dict[str, NodeStep] = {plan.head: obtain}
        # The name the containers run the image by (from its step's ID: known in every
        # preview but one that creates or replaces the step, where it is the config's
        # name, which that step then records).
        named = NodeStep(
            plan.run_name,
            reach=head.reach,
            id_value="name",
            keep_if=plan.run_name_kept_for,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[obtain]),
        )
        self.ref: pulumi.Output[str] = named.id.apply(
            partial(_run_name, plan.ref), run_with_unknowns=True
        )

        # Does the image implement the model without a name? Checked on its rank 0: on the
        # head (the usual case), nothing is streamed to another node or started before it
        # passed; on another node, once the image is there (below).
        check = None
        if plan.support is not None and plan.support_node == plan.head:
            check = self._support_check(plan, head, [obtain], obtain)
        streams_wait: list[pulumi.Input[Any]] = [self.model_checked] if check else []

        # Several workers: a transfer to those that lack it is relayed hop by hop (the
        # image, or an update's new layers, leaves the head once); each worker's stream
        # step then finds it in place, or sends what that worker still lacks, and is what
        # a refresh reads back.
        relayed: pulumi.Output[list[str]] = pulumi.Output.from_input([])
        before: list[pulumi.Input[Any]] = [obtain]
        if args.link_measured is not None:
            before.append(args.link_measured)
        if plan.relay is not None:
            relay = NodeStep(
                plan.relay,
                reach=head.reach,
                # Its stdin: the workers' key (the one a step takes is its read node's);
                # the plan has a relay only when they share one.
                read_reach=args.nodes[next(iter(plan.streams))].reach,
                triggers=[plan.ref, obtain.generation],
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[
                        *before,
                        *streams_wait,
                        *(args.nodes[n].checked for n in plan.streams),
                    ],
                ),
            )
            relayed = relay.stdout.apply(lambda o: key_values(o).get("relayed", "").split(","))
            before.append(relay)
        for node, spec in plan.streams.items():
            target = args.nodes[node]
            self.steps[node] = NodeStep(
                spec,
                reach=head.reach,
                read_reach=target.reach,
                triggers=[plan.ref, obtain.generation],
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=[*before, target.checked, *streams_wait]
                ),
            )
        if plan.support is not None and check is None:
            node = plan.support_node
            check = self._support_check(plan, args.nodes[node], [self.steps[node]], obtain)
        if check is None:  # every model has a name: each checks the image in its weights
            self.support = pulumi.Output.from_input({})
            self.model_checked = gated(obtain.id, obtain)

        probes = {
            n: remote_command(
                plan.versions[n],
                connection=args.nodes[n].connection,
                parent=self,
                secrets={},
                depends_on=[step],
                triggers=[step.generation],
            )
            for n, step in self.steps.items()
        }
        self.versions = pulumi.Output.all(**{n: p.stdout for n, p in probes.items()}).apply(
            plan.agreed_versions
        )
        # The Ray the image holds on the head ("" for none, None while unknown): what
        # `launcher: auto` decides on. Only for `auto` (an explicit launcher adds no step).
        # Its step re-runs only for a new image and carries the value in its ID, so a
        # deployed stack knows it in every preview (an access change included); a stack
        # deployed before the step existed knows it from the head's versions probe.
        # The obtain step re-runs for a new ref that names the same image (a pin of the
        # digest it carries, a new source): the image-name step's ID, kept then (known in
        # that preview), says it is the image this step read, which keeps the step (NodeStep
        # `subject`) and the Ray it read, so the preview decides as `up` does.
        self.head_ray: pulumi.Output[str | None] = pulumi.Output.from_input(None)
        if plan.decide_launcher:
            ray = NodeStep(
                plan.ray,
                reach=head.reach,
                triggers=[obtain.generation],
                id_value=versions.RAY_FIELD,
                subject=named.id,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[obtain]),
            )
            self.head_ray = pulumi.Output.all(ray.id_value, probes[plan.head].stdout).apply(
                _head_ray, run_with_unknowns=True
            )
        kv = {n: s.stdout.apply(key_values) for n, s in self.steps.items()}
        self.fingerprint = pulumi.Output.all(
            **{n: v.apply(lambda d: d.get("fingerprint", "")) for n, v in kv.items()}
        ).apply(lambda f: same_on_every_node(f, "image differs"))
        self.transferred = pulumi.Output.all(
            **{n: _moved_to(n, v, relayed) for n, v in kv.items() if n != plan.head}
        )
        self.image_ids = pulumi.Output.all(
            **{n: v.apply(lambda d: d.get("id", "")) for n, v in kv.items()}
        )
        # Resolve only when the model is supported and fingerprints and versions agree.
        self._checked = gated(
            pulumi.Output.all(self.model_checked, self.fingerprint, self.versions),
            check if check is not None else obtain,
        )
        self.register_outputs(
            {
                "support": self.support,
                "image_ids": self.image_ids,
                "fingerprint": self.fingerprint,
                "versions": self.versions,
                "transferred": self.transferred,
            }
        )

    def _support_check(
        self,
        plan: ImagePlan,
        node: GB10Node,
        after: list[pulumi.Resource],
        obtain: NodeStep,
    ) -> pulumi.Resource:
        """The image-support check on `node` (sets `support` and `model_checked`)."""
        assert plan.support is not None and plan.support_verdict is not None
        check = remote_command(
            plan.support,
            connection=node.connection,
            parent=self,
            secrets={},
            depends_on=after,
            triggers=[obtain.generation, *plan.support_triggers],
        )
        self.support = check.stdout.apply(plan.support_verdict)
        self.model_checked = gated(self.support, check)
        return check

    def ready_on(self, node: str) -> list[pulumi.Input[pulumi.Resource]]:
        """What a container on `node` waits for: the image there, and every check passed
        (an apply that raised blocks it)."""
        return [self.steps[node], self._checked]


def _moved_to(
    node: str, printed: pulumi.Output[dict[str, str]], relayed: pulumi.Output[list[str]]
) -> pulumi.Output[bool]:
    """Whether the image was moved to `node` when the steps last ran: by the relay, or by
    the node's own stream step (what it printed)."""
    return pulumi.Output.all(printed, relayed).apply(
        lambda a: a[0].get("transferred") == "1" or node in a[1]
    )


def _run_name(config_name: str, step_id: object) -> str:
    """The name an image-name step's ID carries (`<step>=<name>-<generation>`); the
    config's while the step is being created or replaced (its ID unknown), which is the
    name it will record."""
    if isinstance(step_id, str) and "=" in step_id:
        return carried(step_id)
    return config_name


def _head_ray(values: object) -> str | None:
    """The Ray version from the image-ray step's ID, else from the head's versions probe;
    None while neither is known (a preview of a new stack or image)."""
    if not isinstance(values, list):
        return None
    from_id, probe = values
    if isinstance(from_id, str) and from_id:
        return str(json.loads(from_id))
    if isinstance(probe, str) and probe:
        return str(last_json(probe).get("ray", ""))
    return None
