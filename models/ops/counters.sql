-- count_event --
-- The one narrow door for counters raised from Python (a SECURITY DEFINER function that only
-- accepts the known counter names).
SELECT count_event(:name, :kind, :by)
