# Install rules and a package config, so that another CMake project can
#   find_package(weft) and target_link_libraries(app PRIVATE weft::weft).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS weft EXPORT weftTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES weft.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft)
foreach(dir core kernels nn data parallel train)
  install(DIRECTORY ${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft/${dir}
    FILES_MATCHING PATTERN "*.h")
endforeach()

install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/weft)
configure_package_config_file(cmake/weftConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/weftConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/weft)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/weftConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/weftConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/weftConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/weft)
