"""A local stand-in for the Pulumi engine and the providers this program uses, for machines
where the Pulumi CLI cannot run. Stateful (one state file per stack), it decides each step by
the engine's rules and calls each provider as that provider behaves; every rule and its
source is listed in docs/engine-rules.md. Where the CLI exists, use `pulumi`."""
