tofu force-unlock -force 602a72e9-05c8-d683-ace0-922cdb193be0
