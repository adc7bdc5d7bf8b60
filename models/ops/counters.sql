-- count_event --
-- The one narrow door for counters raised from Python (a SECURITY DEFINER function that only
-- accepts the known counter names, with no label: the kind argument must be '').
SELECT count_event(:name, '', :by)
