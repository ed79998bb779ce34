"""What gangctl reasons about, below both the decisions (gangctl.policy) and the gang backends
(gangctl.plugins): the resolved job and its gang, the names of the objects gangctl makes, the trainer
progress contract, and the quota policy with its admission arithmetic. Pure, and imports only
gangctl.api, so either layer above may use it without an import climbing back up."""
