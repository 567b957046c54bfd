"""The controller: its pure decision core and the trio service that proposes to the quorum."""
