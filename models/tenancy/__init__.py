"""The tenancy room: organizations, users, memberships and API tokens (``accounts``), who may
do what (``access``), the tenants' own data (``projects``) and the demo seed (``demo``)."""
