# Unit tests of block address translation: the block table, the two translation mechanisms, and
# the mapping plan applied on the simulated GPU.
hiber_test(block_table_test LABEL unit SOURCES block_table_test.cc LIBS hiber_memory)
hiber_test(translation_test LABEL unit SOURCES translation_test.cc LIBS hiber_memory)
hiber_test(translation_sim_test LABEL unit
  SOURCES translation_sim_test.cc
  LIBS hiber_memory hiber_device hiber_common)
