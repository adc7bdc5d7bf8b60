-- Revision 0035: spawn_children() is dropped.
--
-- Workers made a fan-out's children one by one with it until revision 0033 moved fan-outs into
-- the database (start_fan_out, release_children); no worker of this release or the previous one
-- calls it. Kept, it was one more SECURITY DEFINER function the worker role could execute: a
-- lease holder could make children outside its fan-out's plan.

DROP FUNCTION spawn_children(uuid, uuid, text, integer[], jsonb[], integer, integer);
