"""What requests cost and who may still spend: the meter (admit, settle, release), the group-commit ledger,
quota windows, prices, roll-ups, usage reports and the administration of quotas, prices and teams.

May import accounts and db; never serving or api.
"""
